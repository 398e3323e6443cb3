"""How many texts MAUVE needs, measured on real bioRxiv abstracts at several sample sizes n (per side):

- real vs real: two DISJOINT samples of abstracts (the true answer is "same distribution": its spread is MAUVE's
  noise at that n);
- a subtle shift: non-neuroscience abstracts vs neuroscience abstracts;
- a gross shift: abstracts vs titles of other papers.

A minimum is useful only where MAUVE separates the shifted pairs from real-vs-real by more than its spread. The
report (docs/report.md) prints "not enough texts" below the minimum this table supports.

    python benchmarks/mauve_min_sample.py [--sizes 16 32 50 100 200 400] [--draws 5] [--max-chars 600]

Same settings as ACTG's evaluation: MiniLM embeddings, buckets max(2, min(n/10, 50)), MAUVE averaged over
k-means seeds 1, 2, 3. Each draw is an independent pair of disjoint samples (numpy seed = draw).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import pandas as pd
from sample_size import note


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[16, 32, 50, 100, 200, 400])
    ap.add_argument("--draws", type=int, default=5)
    ap.add_argument("--max-chars", type=int, default=600)
    args = ap.parse_args()

    from dpsynth_core.actg.evaluation import CachedEmbedder
    from dpsynth_core.actg.text_eval import mauve_score
    from dpsynth_core.data.public import data_dir
    from dpsynth_core.models import load_embedder

    corpus = pd.read_csv(data_dir() / "biorxiv" / "biorxiv_1500.csv").dropna(subset=["abstract", "title"])
    texts = [str(t)[: args.max_chars] for t in corpus["abstract"]]
    titles = [str(t)[: args.max_chars] for t in corpus["title"]]
    neuro = np.flatnonzero((corpus["category"] == "neuroscience").to_numpy())
    other = np.flatnonzero((corpus["category"] != "neuroscience").to_numpy())
    emb = CachedEmbedder(load_embedder("minilm"))

    def mauve(a: list[str], b: list[str]) -> tuple[float, int]:
        runs = [mauve_score(a, b, embedder=emb, seed=s) for s in (1, 2, 3)]
        return float(np.mean([r["mauve"] for r in runs])), runs[0]["num_buckets"]

    def cell(v: list[float]) -> str:
        return f"{np.mean(v):.3f} ± {np.std(v, ddof=1):.3f} [{min(v):.3f}, {max(v):.3f}]" if v else "n/a"

    print(f"corpus: {len(texts)} abstracts; draws per size: {args.draws}; mean ± sd [min, max] over draws "
          + note("the texts per side in the first column", args.draws, "real vs real (the first MAUVE column)")
          + "; each MAUVE the mean over 3 k-means seeds")
    print("| n per side | buckets | real vs real (disjoint abstracts) | abstracts vs neuroscience abstracts "
          "| abstracts vs titles |")
    print("| --- | --- | --- | --- | --- |")
    for n in args.sizes:
        if 2 * n > len(texts):
            continue
        same, subtle, far, buckets = [], [], [], None
        t0 = time.perf_counter()
        for draw in range(args.draws):
            rng = np.random.default_rng(draw)
            idx = rng.permutation(len(texts))
            a = [texts[i] for i in idx[:n]]
            value, buckets = mauve(a, [texts[i] for i in idx[n: 2 * n]])
            same.append(value)
            far.append(mauve(a, [titles[i] for i in idx[n: 2 * n]])[0])
            if n <= len(neuro):  # one category against the others: a subtle shift
                subtle.append(mauve([texts[i] for i in rng.permutation(other)[:n]],
                                    [texts[i] for i in rng.permutation(neuro)[:n]])[0])
        print(f"| {n} | {buckets} | {cell(same)} | {cell(subtle)} | {cell(far)} |"
              f"  <!-- {time.perf_counter() - t0:.0f} s -->", flush=True)

if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
