"""Agreement of attribute extractors with the oracle labels of ../shared/data/biorxiv.

    .venv/bin/python experiments/extractor_agreement.py --n-embedding 200 --n-lm 60 --out benchmarks/results
    # plus the OpenAI-compatible client against a served model (here SmolLM2 on Ray Serve):
    dpsynth serve start --config configs/serve_smollm2.yaml
    .venv/bin/python experiments/extractor_agreement.py --n-openai 30 --openai-base-url http://127.0.0.1:8000/v1

Per field and mean agreement for the embedding zero-shot extractor (MiniLM) and the LM-choice
extractor (SmolLM2-135M-Instruct) on a fixed random subsample, and optionally the OpenAI-compatible
client against any served model; writes
extractor_agreement.json and extractor_agreement.png (bars per field). Only aggregate numbers
are written; no abstract is printed. Sizes are chosen to finish in ~10 min on 2 shared cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _oracle(n: int, seed: int):
    import pandas as pd

    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "biorxiv" / "biorxiv_1500.csv"
    df = pd.read_csv(path).sample(n=n, random_state=seed)
    texts = (df["title"].astype(str) + ". " + df["abstract"].astype(str)).tolist()
    return texts, df["schema"].map(json.loads).tolist()


def _agreement(extractor, texts, gold, fields):
    from dpsynth_core.actg.text_eval import per_field_accuracy

    t0 = time.time()
    rows = extractor.extract(texts)
    out = per_field_accuracy(rows, gold, fields)
    out.update(n=len(texts), seconds=round(time.time() - t0, 1))
    return out


def _majority(gold, fields):
    """Reference line: always answering each field's most frequent oracle label (not an extractor)."""
    from collections import Counter

    per = {f: Counter(g[f] for g in gold).most_common(1)[0][1] / len(gold) for f in fields}
    return {"per_field": per, "mean": sum(per.values()) / len(per), "n": len(gold)}


def _plot(results: dict, fields, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(results)
    x = np.arange(len(fields) + 1)
    width = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(11, 4))
    for i, name in enumerate(names):
        vals = [results[name]["per_field"][f] for f in fields] + [results[name]["mean"]]
        ax.bar(x + i * width, vals, width, label=f"{name} (n={results[name]['n']})")
    ax.set_xticks(x + width * (len(names) - 1) / 2)
    ax.set_xticklabels(fields + ["MEAN"], rotation=30, ha="right", fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_ylabel("agreement with oracle")
    ax.legend(fontsize=8)
    ax.set_title("bioRxiv attribute extraction: agreement with the oracle labels")
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".png")
    os.close(fd)
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    os.replace(tmp, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-embedding", type=int, default=200)
    ap.add_argument("--n-lm", type=int, default=60)
    ap.add_argument("--lm-model", default="smollm2-135m-instruct")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest on a busy box)")
    ap.add_argument("--n-openai", type=int, default=0,
                    help="records for the OpenAI-compatible extractor (needs --openai-base-url)")
    ap.add_argument("--openai-base-url", default=None,
                    help="e.g. http://127.0.0.1:8000/v1 (dpsynth serve start) or a vLLM server; key from OPENAI_API_KEY")
    ap.add_argument("--openai-model", default="smollm2")
    ap.add_argument("--openai-max-tokens", type=int, default=256)
    ap.add_argument("--openai-timeout", type=float, default=600.0,
                    help="seconds per request (a CPU-served model answering 4 requests at once needs minutes)")
    ap.add_argument("--allow-external-processing", action="store_true",
                    help="send the abstracts to a non-loopback --openai-base-url (refused otherwise)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()

    import torch

    from dpsynth_core.actg.extractors import EmbeddingExtractor, LMChoiceExtractor
    from dpsynth_core.actg.schema import builtin_schema

    torch.set_num_threads(args.threads)
    schema = builtin_schema("biorxiv")
    fields = schema.field_names
    if args.n_openai > 0 and not args.openai_base_url:
        ap.error("--n-openai needs --openai-base-url")
    texts, gold = _oracle(max(args.n_embedding, args.n_lm, args.n_openai), args.seed)
    results = {}
    if args.n_embedding > 0:
        results["embedding (MiniLM)"] = _agreement(EmbeddingExtractor(schema), texts[: args.n_embedding],
                                                   gold[: args.n_embedding], fields)
        print(f"embedding: mean {results['embedding (MiniLM)']['mean']:.3f}", flush=True)
    if args.n_lm > 0:
        lm = LMChoiceExtractor(schema, model=args.lm_model, progress=True)
        results[f"LM choice ({args.lm_model})"] = _agreement(lm, texts[: args.n_lm], gold[: args.n_lm], fields)
    if args.n_openai > 0:
        from dpsynth_core.actg.extractors import OpenAIExtractor

        client = OpenAIExtractor(schema, model=args.openai_model, base_url=args.openai_base_url,
                                 max_tokens=args.openai_max_tokens, timeout_s=args.openai_timeout,
                                 allow_external_processing=args.allow_external_processing)
        name = f"OpenAI-compatible ({args.openai_model})"
        results[name] = _agreement(client, texts[: args.n_openai], gold[: args.n_openai], fields)
        results[name]["answers"] = dict(client.stats)  # requests, unparsed JSON, missing fields
        print(f"openai: mean {results[name]['mean']:.3f} {client.stats}", flush=True)
    results["majority label (reference)"] = _majority(gold[: args.n_embedding or args.n_lm], fields)

    args.out.mkdir(parents=True, exist_ok=True)
    payload = {"fields": fields, "seed": args.seed, "results": results}
    fd, tmp = tempfile.mkstemp(dir=args.out, suffix=".json")
    with os.fdopen(fd, "w") as fh:
        json.dump(payload, fh, indent=2)
    os.replace(tmp, args.out / "extractor_agreement.json")
    _plot(results, fields, args.out / "extractor_agreement.png")

    header = "| field | " + " | ".join(results) + " |"
    print(header)
    print("|" + "---|" * (len(results) + 1))
    for f in fields + ["mean"]:
        vals = [r["per_field"][f] if f != "mean" else r["mean"] for r in results.values()]
        print(f"| {f} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    print("seconds:", {k: v.get("seconds") for k, v in results.items()})


if __name__ == "__main__":
    main()
