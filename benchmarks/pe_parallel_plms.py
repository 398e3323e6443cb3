"""Wall time of one WASP generation round: K PLMs called concurrently vs one after another.

    .venv/bin/python benchmarks/pe_parallel_plms.py --config configs/wasp_demo.yaml [--backend serve] [--repeats 1]

Uses the config's PLMs, budget per round (N / (T + 1)), max_new_tokens and the contrastive prompt
template. The good / bad examples in the prompts are zero-shot samples picked at random: no
private data is read (timing only). Each repeat runs the same prompts and seeds in both modes,
parallel first then sequential, then the order is swapped on the next repeat.
The machine is shared: run it when quiet and read the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from sample_size import note

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/wasp_demo.yaml")
    ap.add_argument("--backend", choices=["serve", "ray_actor"], default=None, help="override every PLM's backend")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()

    import numpy as np
    import ray

    from dpsynth_core.config import load_config
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.engines import SamplingParams
    from dpsynth_core.pe.prompts import load_prompts
    from dpsynth_core.pe.weights import allocate_budget
    from ray_jobs.pe_backends import make_llms

    cfg = load_config(args.config, PEConfig)
    plms = [p.model_copy(update={"backend": args.backend}) if args.backend else p for p in cfg.plms]
    classes = list(cfg.data.classes)
    prompts = load_prompts(cfg.prompts)
    per_round = cfg.num_synthetic // (cfg.iterations + 1)
    k = len(plms)
    t0 = time.perf_counter()
    llms = make_llms(plms)
    load_s = time.perf_counter() - t0

    def labels_for_round() -> list[list[str]]:
        out: list[list[str]] = [[] for _ in range(k)]
        for c, n_c in zip(classes, allocate_budget(np.ones(len(classes)), per_round)):
            for j, n in enumerate(allocate_budget(np.full(k, 1.0 / k), n_c)):
                out[j] += [c] * n
        return out

    def params(j: int, rnd: int) -> SamplingParams:
        p = plms[j]
        return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=p.temperature,
                              top_p=p.top_p, seed=7919 * rnd + 101 * j + p.seed)

    def run(requests, rnd: int, parallel: bool) -> tuple[float, list[float], list[list[str]]]:
        start = time.perf_counter()
        per_plm = []
        if parallel:
            handles = [llm.submit(r, params(j, rnd)) for j, (llm, r) in enumerate(zip(llms, requests))]
            texts = []
            for h in handles:
                texts.append(h.result())
                per_plm.append(time.perf_counter() - start)  # finish time of each, measured from the start
        else:
            texts = []
            for j, (llm, r) in enumerate(zip(llms, requests)):
                s = time.perf_counter()
                texts.append(llm.submit(r, params(j, rnd)).result())
                per_plm.append(time.perf_counter() - s)
        return time.perf_counter() - start, per_plm, texts

    labels = labels_for_round()
    zero_shot = [[prompts.render_zero_shot(c) for c in ls] for ls in labels]
    zs_wall, _, zs_texts = run(zero_shot, 0, parallel=True)  # also warms up every PLM
    pool = {c: [t for ts, ls in zip(zs_texts, labels) for t, y in zip(ts, ls) if y == c] for c in classes}
    rng = np.random.default_rng(0)
    contrastive = []
    for ls in labels:
        row = []
        for c in ls:
            picks = [pool[c][i] for i in rng.permutation(len(pool[c]))]
            s = cfg.select_per_class
            row.append(prompts.render_contrastive(c, picks[:s], picks[s : 2 * s]))
        contrastive.append(row)

    results = []
    for r in range(args.repeats):
        order = [True, False] if r % 2 == 0 else [False, True]
        for parallel in order:
            wall, per_plm, _ = run(contrastive, 1, parallel)
            results.append({"repeat": r, "samples": sum(len(x) for x in contrastive),
                            "mode": "parallel" if parallel else "sequential",
                            "wall_s": round(wall, 2), "per_plm_s": [round(x, 2) for x in per_plm]})
            print(json.dumps(results[-1]), flush=True)
    for llm in llms:
        llm.close()
    par = [x["wall_s"] for x in results if x["mode"] == "parallel"]
    seq = [x["wall_s"] for x in results if x["mode"] == "sequential"]
    summary = {
        "config": args.config, "backends": [p.backend for p in plms], "plms": [p.display_name for p in plms],
        "samples_per_round": per_round, "max_new_tokens": cfg.max_new_tokens, "load_s": round(load_s, 1),
        "zero_shot_round_parallel_s": round(zs_wall, 2),
        "contrastive_round_parallel_s": par, "contrastive_round_sequential_s": seq,
        "speedup_mean": round(float(np.mean(seq) / np.mean(par)), 2),
        "speedup_note": note(f"{sum(len(x) for x in contrastive)} samples per round", len(par),
                             "the same round with the PLMs one after another (sequential / parallel wall time)"),
    }
    print(json.dumps(summary))
    ray.shutdown()


if __name__ == "__main__":
    main()
