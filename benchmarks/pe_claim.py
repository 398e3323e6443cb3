"""The WASP claim (issue 17): downstream accuracy of WASP, Aug-PE, zero-shot multi-PLM generation, the
private samples alone and WASP's ablations, on one real held-out test set, over several seeds.

    nice -n 10 .venv/bin/python benchmarks/pe_claim.py --config configs/wasp_claim.yaml \
        --seeds 0 1 2 --out /work/figures/wasp_claim [--num-synthetic 150] [--methods ...]

Per seed: one secret draw of the M private records (OS entropy, as in every run), the two PLMs loaded
once (in-process), and a fresh zero-shot pool per PLM and class that every method of that seed starts
from (common random numbers: WASP's first round, Aug-PE's first population and the zero-shot baseline
are the same draws, so the comparison is not blurred by different starting samples). Every DP run has
its own ledger (eps, delta from the config) and fresh OS-entropy vote noise. Results go to
``<out>/results.jsonl`` (one line per seed and method, appended as they finish: a rerun skips them),
and the table (mean +- sd over seeds) is printed at the end. Owner-side numbers only: accuracy on the
held-out real records is a benchmark figure, not a release.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections import Counter
from pathlib import Path

from sample_size import note

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TQDM_DISABLE", "1")

# name -> config overrides of the base (WASP) config
DP_VARIANTS = {
    "wasp": {},
    "augpe": {"method": "augpe"},
    "wasp_no_contrastive": {"contrastive": False},
    "wasp_no_weighting": {"plm_weighting": "uniform"},
    "wasp_q1": {"q": 1},
    # the reference code's T: N split equally over the zero-shot round and 4 voted rounds (1,200 each of 6,000)
    "wasp_t4": {"iterations": 4},
    "wasp_eps_inf": {"epsilon": float("inf"), "not_private": True},  # reference only (ledger: not private)
}
# Phase 1 (the claim) runs for every seed before phase 2 (the ablations), so a cut-short grid still has
# the main comparison over all seeds.
PHASES = [["zero_shot", "private_only", "wasp", "augpe"], ["wasp_no_contrastive", "wasp_no_weighting", "wasp_q1"],
          ["wasp_t4"], ["wasp_eps_inf"]]
DEFAULT_METHODS = [m for phase in PHASES[:2] for m in phase]


class SharedZeroShot:
    """Wraps one PLM: zero-shot prompts are served from a per-class pool of this PLM's zero-shot
    completions (the i-th zero-shot prompt of class c in a call gets pool[c][i]), generated on demand
    with seeds fixed by (seed, class, position); every other prompt goes to the PLM."""

    def __init__(self, llm, prompts, classes: list[str], seed: int) -> None:
        self.inner, self.name, self.seed = llm, llm.name, seed
        self.label_of = {prompts.render_zero_shot(c): c for c in classes}
        self.classes = list(classes)
        self.pool: dict[str, list[str]] = {c: [] for c in classes}
        self.generated = 0  # completions this wrapper asked the PLM for (pool + pass-through)
        from concurrent.futures import ThreadPoolExecutor

        # One thread per PLM: the runner submits every PLM's prompts before waiting, so the PLMs generate
        # concurrently (torch releases the GIL). Generation is post-processing: its seeds are not DP randomness.
        self.worker = ThreadPoolExecutor(max_workers=1)

    def _fill(self, label: str, n: int, params) -> None:
        from dpsynth_core.engines import SamplingParams

        missing = n - len(self.pool[label])
        if missing > 0:
            seed = self.seed * 1_000_003 + self.classes.index(label) * 10_007 + len(self.pool[label])
            prompt = next(p for p, c in self.label_of.items() if c == label)
            p = SamplingParams(max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                               top_p=params.top_p, seed=seed)
            self.pool[label] += self.inner.generate([prompt] * missing, p)
            self.generated += missing

    def submit(self, prompts, params):
        return self.worker.submit(self.generate, prompts, params)  # a Future: .result()

    def generate(self, prompts: list[str], params) -> list[str]:
        if prompts and all(p in self.label_of for p in prompts):
            need = Counter(self.label_of[p] for p in prompts)
            for label, n in need.items():
                self._fill(label, n, params)
            seen: Counter = Counter()
            out = []
            for p in prompts:
                label = self.label_of[p]
                out.append(self.pool[label][seen[label]])
                seen[label] += 1
            return out
        self.generated += len(prompts)
        return self.inner.generate(prompts, params)

    def close(self) -> None:
        pass


class CachedEmbedding:
    """Memoises embeddings by text: the private and test records are encoded once per grid, not per method."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.cache = inner, inner.name, {}

    def encode(self, texts):
        import numpy as np

        missing = list(dict.fromkeys(t for t in texts if t not in self.cache))
        if missing:
            self.cache.update(zip(missing, self.inner.encode(missing)))
        return np.stack([self.cache[t] for t in texts]) if texts else self.inner.encode([])


def _config(base: dict, overrides: dict, seed: int, run_dir: Path, num_synthetic: int):
    from dpsynth_core.pe.config import PEConfig

    return PEConfig.model_validate({**base, **overrides, "seed": seed, "output_dir": str(run_dir),
                                    "num_synthetic": num_synthetic, "evaluate": False, "baselines": False})


def _per_plm_accuracy(embedding, texts, labels, plm_ids, names, test_emb, test_labels, seed) -> dict:
    from dpsynth_core.pe.evaluate import downstream_accuracy

    out = {}
    for k, name in enumerate(names):
        idx = [i for i, p in enumerate(plm_ids) if p == k]
        if idx:
            emb = embedding.encode([texts[i] for i in idx])
            out[name] = downstream_accuracy(emb, [labels[i] for i in idx], test_emb, test_labels, seed)
    return out


class Seed:
    """What every method of one seed shares: the secret draw of the M private records (held in memory
    only) and the zero-shot pools."""

    def __init__(self, seed: int, base: dict, llms, embedding) -> None:
        from dpsynth_core.pe.config import PEConfig
        from dpsynth_core.pe.data_split import split_data
        from dpsynth_core.pe.prompts import load_prompts

        self.seed = seed
        cfg = PEConfig.model_validate(base)
        self.private, test_texts, self.test_labels, self.classes = split_data(cfg)  # fresh secret draw
        self.test_emb = embedding.encode(test_texts)
        self.shared = [SharedZeroShot(llm, load_prompts(cfg.prompts), self.classes, seed) for llm in llms]
        self.names = [p.display_name for p in cfg.plms]


def run_method(ctx: Seed, method: str, base: dict, args, embedding, out: Path) -> None:
    from dpsynth_core.pe.evaluate import downstream_accuracy, evaluate_synthetic
    from dpsynth_core.pe.pipeline import execute, make_runner, open_ledger
    from dpsynth_core.privacy import PrivacyLedger

    seed, shared, names = ctx.seed, ctx.shared, ctx.names
    test_emb, test_labels = ctx.test_emb, ctx.test_labels

    def emit(row: dict) -> None:
        row = {"seed": seed, "method": method, **row, "seconds": round(time.perf_counter() - t0, 1)}
        with open(out / "results.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps({k: row[k] for k in row if k != "history"}), flush=True)

    t0 = time.perf_counter()
    run_dir = out / f"seed{seed}" / method
    if run_dir.exists():
        shutil.rmtree(run_dir)  # a partial run of an earlier attempt: start clean (own ledger)
    run_dir.mkdir(parents=True)
    before = sum(s.generated for s in shared)
    if method == "private_only":  # non-DP reference: the M private records themselves
        emb = embedding.encode(ctx.private.texts)
        emit({"accuracy": downstream_accuracy(emb, ctx.private.labels, test_emb, test_labels, seed), "dp": False})
        return
    if method == "zero_shot":  # no private data: N samples, PLMs equally, classes evenly
        cfg = _config(base, {}, seed, run_dir, args.num_synthetic)
        runner = make_runner(cfg, shared, embedding, open_ledger(cfg, run_dir), ctx.classes, (), run_dir)
        pop, _, _ = runner.zero_shot(args.num_synthetic)
        ev = evaluate_synthetic(embedding.encode(pop.texts), pop.labels, test_emb, test_labels,
                                with_mauve=False, seed=seed)
        per_plm = _per_plm_accuracy(embedding, pop.texts, pop.labels, pop.plm_ids, names, test_emb,
                                    test_labels, seed)
        emit({**ev, "per_plm_accuracy": per_plm, "epsilon": 0.0,
              "generated": sum(s.generated for s in shared) - before})
        return
    cfg = _config(base, DP_VARIANTS[method], seed, run_dir, args.num_synthetic)
    state = execute(cfg, run_dir, shared, ctx.private, ctx.classes, embedding)
    pop = state.population
    ev = evaluate_synthetic(embedding.encode(pop.texts), pop.labels, test_emb, test_labels,
                            with_mauve=False, seed=seed)
    ledger = PrivacyLedger.open(run_dir)
    emit({
        **ev, "epsilon": ledger.total_epsilon(), "delta": ledger.delta, "private": ledger.is_private,
        "plm_weights": [r.get("plm_weights") for r in state.history],
        "plm_share_final": [pop.plm_ids.count(k) / max(len(pop), 1) for k in range(len(names))],
        "sigma": next((r["sigma"] for r in state.history if "sigma" in r), None),
        "generated": sum(s.generated for s in shared) - before, "history": state.history,
    })


def table(rows: list[dict], methods: list[str]) -> str:
    import numpy as np

    lines = ["method                 seeds  n train  n test  accuracy (mean +- sd)  majority class (baseline)  per-seed"]
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        if not mine:
            continue
        accs = [r["accuracy"] for r in mine]
        sd = float(np.std(accs, ddof=1)) if len(accs) > 1 else float("nan")
        lines.append(f"{m:<22} {len(accs):>5}  {_sizes(mine, 'n_train'):>7}  {_sizes(mine, 'n_test'):>6}  "
                     f"{np.mean(accs):.3f} +- {sd:.3f}         {_sizes(mine, 'majority_baseline'):>9}               "
                     + " ".join(f"{a:.3f}" for a in accs))
    lines.append(note("the synthetic samples (n train) each classifier is trained on, tested on n test held-out real "
                      "records", max((sum(r["method"] == m for r in rows) for m in methods), default=1),
                      "the majority class's accuracy on the same test records; zero_shot (no private data)"))
    for m in ("wasp", "wasp_t4"):
        weights = [r["plm_weights"][-1] for r in rows if r["method"] == m and r.get("plm_weights")]
        if weights and m in methods:
            lines.append(f"{m} final PLM weights per seed: " + "; ".join(
                "[" + ", ".join(f"{w:.2f}" for w in ws) + "]" for ws in weights))
    per_plm = [r["per_plm_accuracy"] for r in rows if r["method"] == "zero_shot" and r.get("per_plm_accuracy")]
    if per_plm:
        names = list(per_plm[0])
        lines.append("zero-shot accuracy per PLM (mean over seeds): " + ", ".join(
            f"{n} {np.mean([p[n] for p in per_plm if n in p]):.3f}" for n in names))
    return "\n".join(lines)


def _sizes(rows: list[dict], key: str) -> str:
    """One run's value of ``key`` (a count or a baseline), or every distinct value, or '?' for older rows."""
    vals = sorted({round(r[key], 3) if isinstance(r.get(key), float) else r.get(key) for r in rows} - {None})
    return "/".join(str(v) for v in vals) or "?"


def analyse(out: Path, config: str) -> str:
    """Why an ordering fails: per finished run, the downstream accuracy of each generation round's samples
    alone (same size: WASP's zero-shot round 0 vs its contrastive round 1) and Aug-PE's unique selected
    samples. Reads the runs' checkpoints (synthetic samples only) and the held-out test set."""
    import numpy as np
    import yaml

    from dpsynth_core.pe.checkpoint import load_latest_checkpoint
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.pe.data_split import split_data
    from dpsynth_core.pe.embedding import SentenceEmbedding
    from dpsynth_core.pe.evaluate import downstream_accuracy

    base = yaml.safe_load(Path(config).read_text(encoding="utf-8"))
    _, test_texts, test_labels, _ = split_data(PEConfig.model_validate(base))  # the public held-out rule
    embedding = CachedEmbedding(SentenceEmbedding(base.get("embedder", "minilm")))
    test_emb = embedding.encode(test_texts)
    per: dict[str, dict[str, list[float]]] = {}
    for run_dir in sorted(out.glob("seed*/*")):
        state = load_latest_checkpoint(run_dir) if (run_dir / "checkpoints").is_dir() else None
        if state is None or not state.population.texts:
            continue
        pop, row = state.population, per.setdefault(run_dir.name, {})
        for rnd in sorted(set(pop.born)):
            idx = [i for i, b in enumerate(pop.born) if b == rnd]
            acc = downstream_accuracy(embedding.encode([pop.texts[i] for i in idx]), [pop.labels[i] for i in idx],
                                      test_emb, test_labels, 0)
            row.setdefault(f"round{rnd}_acc", []).append(acc)
        row.setdefault("unique_share", []).append(len(set(pop.texts)) / len(pop.texts))
    lines = []
    for name, row in per.items():
        lines.append(f"{name:<22} " + "  ".join(f"{k} {np.mean(v):.3f} +- {np.std(v, ddof=1) if len(v) > 1 else 0:.3f}"
                                               f" (n={len(v)})" for k, v in row.items()))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/wasp_claim.yaml")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=DEFAULT_METHODS,
                    choices=["zero_shot", "private_only", *DP_VARIANTS])
    ap.add_argument("--num-synthetic", type=int, default=None, help="N (default: the config's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per PLM")
    ap.add_argument("--out", default="/work/figures/wasp_claim")
    ap.add_argument("--table-only", action="store_true", help="print the table of <out>/results.jsonl")
    ap.add_argument("--analyse", action="store_true", help="per-round accuracy of the finished runs' samples")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()] if results.is_file() else []
    if args.table_only or args.analyse:
        print(table(rows, args.methods))
        if args.analyse:
            print(analyse(out, args.config))
        return

    import logging

    import yaml

    logging.getLogger("transformers").setLevel(logging.ERROR)
    from dpsynth_core.pe.embedding import SentenceEmbedding
    from dpsynth_core.pe.llm import HFLocalLLM

    base = yaml.safe_load(Path(args.config).read_text(encoding="utf-8"))
    args.num_synthetic = args.num_synthetic or int(base.get("num_synthetic", 50))
    embedding = CachedEmbedding(SentenceEmbedding(base.get("embedder", "minilm")))
    llms = [HFLocalLLM(p["model"], batch_size=p.get("batch_size", 16), num_threads=args.threads, name=p.get("name"),
                       **({"engine": p["engine"]} if "engine" in p else {})) for p in base["plms"]]
    done = {(r["seed"], r["method"]) for r in rows}
    seeds: dict[int, Seed] = {}
    for phase in PHASES:
        for seed in args.seeds:
            for method in [m for m in phase if m in args.methods and (seed, m) not in done]:
                if seed not in seeds:
                    seeds[seed] = Seed(seed, base, llms, embedding)
                run_method(seeds[seed], method, base, args, embedding, out)
    rows = [json.loads(x) for x in results.read_text().splitlines() if x.strip()]
    rows = [r for r in rows if r["seed"] in args.seeds]
    print(table(rows, args.methods))


if __name__ == "__main__":
    main()
