"""Wall time of two generating stages on the HF and the vLLM engine, paired in one run.

    .venv/bin/python experiments/engine_pipelines.py wasp   [--config configs/wasp_demo.yaml] [--repeats 1]
    .venv/bin/python experiments/engine_pipelines.py dpfair [--rows 200] [--repeats 1]

``wasp``: the generation of one WASP iteration (a contrastive round) with the config's 2 PLMs, each
PLM loaded once per engine (``dpsynth_core.pe.llm.LocalLLM``, engine hf / vllm). The round's budget
is the config's N / (T + 1), split over classes and PLMs as the runner splits it; the good / bad
examples are zero-shot samples (no private data is read: timing only). Both engines get the same
prompts and seeds; each repeat runs hf then vllm, the next vllm then hf. The PLMs run one after the
other on both engines. Embedding and DP voting are the same code on either engine and not timed.

``dpfair``: ``--rows`` DPFairLLM rows (``tabular.generation.generate_rows``) from SmolLM2 on the
adult schema, without the fairness rejection sampler (it needs full logits, so it stays on HF):
HF under the constrained-decoding logits processor vs vLLM under the row regex.

Needs vLLM (``make install`` installs it). The machine may be shared: the load average is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ENGINES = ("hf", "vllm")


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def engine_orders(repeats: int) -> list[tuple[str, str]]:
    """hf then vllm, then vllm then hf, ...: neither engine always runs on the warmer machine."""
    return [ENGINES if r % 2 == 0 else ENGINES[::-1] for r in range(repeats)]


def plm_on(plm, engine: str, kv_cache_gib: float):
    """The runner's in-process PLM (pe.llm.LocalLLM: same prompts, chat rule and cleaning) on ``engine``,
    with a vLLM KV cache of ``kv_cache_gib`` (LocalLLM keeps the engine default, 4 GiB)."""
    from dpsynth_core.engines import EngineConfig, load_engine
    from dpsynth_core.pe.llm import LocalLLM

    class SizedLocalLLM(LocalLLM):
        def __init__(self) -> None:  # LocalLLM.__init__, plus kv_cache_gib
            self.model_name, self.name = plm.model, plm.display_name
            self.engine = load_engine(EngineConfig(model=plm.model, backend=engine, hf_batch_size=plm.batch_size,
                                                   torch_threads=os.cpu_count(), max_model_len=4096,
                                                   kv_cache_gib=kv_cache_gib))
            self.chat = bool(getattr(self.engine.tokenizer, "chat_template", None))

    return SizedLocalLLM()


def wasp(args) -> dict:
    import numpy as np

    from dpsynth_core.config import load_config
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.engines import SamplingParams
    from dpsynth_core.pe.prompts import load_prompts
    from dpsynth_core.pe.weights import allocate_budget

    cfg = load_config(args.config, PEConfig)
    plms, classes = cfg.plms, list(cfg.data.classes)
    templates = load_prompts(cfg.prompts)
    per_round = cfg.num_synthetic // (cfg.iterations + 1)
    labels: list[list[str]] = [[] for _ in plms]
    for c, n_c in zip(classes, allocate_budget(np.ones(len(classes)), per_round)):
        for j, n in enumerate(allocate_budget(np.full(len(plms), 1.0 / len(plms)), n_c)):
            labels[j] += [c] * n

    def params(j: int) -> SamplingParams:
        return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=plms[j].temperature,
                              top_p=plms[j].top_p, seed=101 * j + plms[j].seed)

    loaded, load_s = {}, {}
    for engine in ENGINES:
        start = time.perf_counter()
        loaded[engine] = [plm_on(p, engine, args.kv_cache_gib) for p in plms]
        load_s[engine] = round(time.perf_counter() - start, 1)
    try:
        # Zero-shot samples (vLLM, fast) become the good / bad examples of the contrastive prompts.
        zero_shot = [llm.generate([templates.render_zero_shot(c) for c in ls], params(j))
                     for j, (llm, ls) in enumerate(zip(loaded["vllm"], labels))]
        pool = {c: [t for ts, ls in zip(zero_shot, labels) for t, y in zip(ts, ls) if y == c] for c in classes}
        rng = np.random.default_rng(0)
        s = cfg.select_per_class
        contrastive = []
        for ls in labels:
            picks = [[pool[c][i] for i in rng.permutation(len(pool[c]))] for c in ls]
            contrastive.append([templates.render_contrastive(c, p[:s], p[s:2 * s]) for c, p in zip(ls, picks)])
        rounds = []
        for repeat, order in enumerate(engine_orders(args.repeats)):
            for engine in order:
                start = time.perf_counter()
                per_plm = []
                for j, (llm, prompts) in enumerate(zip(loaded[engine], contrastive)):
                    t0 = time.perf_counter()
                    llm.generate(prompts, params(j))
                    per_plm.append(round(time.perf_counter() - t0, 1))
                rounds.append({"repeat": repeat, "engine": engine, "wall_s": round(time.perf_counter() - start, 1),
                               "per_plm_s": per_plm, "load_avg": load_average()})
                print(json.dumps(rounds[-1]), flush=True)
    finally:
        for llms in loaded.values():
            for llm in llms:
                llm.close()
    return {"bench": "wasp_round", "config": args.config, "plms": [p.display_name for p in plms],
            "prompts_per_plm": [len(x) for x in contrastive], "max_new_tokens": cfg.max_new_tokens,
            "load_s": load_s, "rounds": rounds, **ratio(rounds)}


def dpfair(args) -> dict:
    from dpsynth_core.tabular.config import GenerationSettings
    from dpsynth_core.tabular.generation import generate_rows, open_row_generator
    from dpsynth_core.tabular.schema import load_schema
    from dpsynth_core.tabular.serialize import RowSerializer

    schema = load_schema("configs/schemas/adult.yaml").select(args.columns)
    settings = GenerationSettings(num_rows=args.rows, batch_size=args.batch_size, seed=0)
    loaded, load_s = {}, {}
    for engine in ENGINES:
        start = time.perf_counter()
        loaded[engine] = open_row_generator(args.model, None, settings, engine=engine)
        load_s[engine] = round(time.perf_counter() - start, 1)
    runs = []
    try:
        for repeat, order in enumerate(engine_orders(args.repeats)):
            for engine in order:
                serializer = RowSerializer(schema, prefix="names", seed=repeat)
                start = time.perf_counter()
                result = generate_rows(loaded[engine], None, serializer, settings, progress=False)
                runs.append({"repeat": repeat, "engine": engine, "wall_s": round(time.perf_counter() - start, 1),
                             "rows": len(result.frame), "attempted": result.attempted, "invalid": result.invalid,
                             "load_avg": load_average()})
                print(json.dumps(runs[-1]), flush=True)
    finally:
        for engine in loaded.values():
            engine.close()
    return {"bench": "dpfair_rows", "model": args.model, "columns": args.columns, "rows": args.rows,
            "batch_size": args.batch_size, "load_s": load_s, "rounds": runs, **ratio(runs)}


def ratio(rounds: list[dict]) -> dict:
    """Mean wall time per engine and HF / vLLM (how many times faster vLLM is)."""
    mean = {e: sum(r["wall_s"] for r in rounds if r["engine"] == e) / max(1, sum(r["engine"] == e for r in rounds))
            for e in ENGINES}
    return {"mean_wall_s": {e: round(v, 1) for e, v in mean.items()},
            "hf_over_vllm": round(mean["hf"] / mean["vllm"], 2) if mean["vllm"] else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="bench", required=True)
    w = sub.add_parser("wasp")
    w.add_argument("--config", default="configs/wasp_demo.yaml")
    w.add_argument("--kv-cache-gib", type=float, default=4.0, help="vLLM KV cache per PLM")
    d = sub.add_parser("dpfair")
    d.add_argument("--model", default="smollm2-135m-instruct")
    d.add_argument("--rows", type=int, default=200)
    d.add_argument("--batch-size", type=int, default=50)
    d.add_argument("--columns", nargs="+", default=["age", "education", "marital_status", "occupation", "race",
                                                     "sex", "hours_per_week", "income"])
    for p in (w, d):
        p.add_argument("--repeats", type=int, default=1)
        p.add_argument("--json", help="also write the result here")
    args = parser.parse_args()
    print(f"load average before: {load_average()} ({os.cpu_count()} CPUs)", flush=True)
    result = wasp(args) if args.bench == "wasp" else dpfair(args)
    result["load_avg_after"] = load_average()
    print(json.dumps(result), flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=2)


if __name__ == "__main__":  # vLLM spawns its engine process: building it at import time would fail
    main()
