"""The ACTG-ARL paper's table on bioRxiv at eps = 4: vanilla DP-FT, ACTG, ACTG-ARL, RL without anchor,
the ablations "AIM -> DP-FT features" and "direct prompting", and the eps = inf reference.

    nice -n 10 .venv/bin/python benchmarks/actg_table.py --scale small --seeds 0 1 2 --out /work/figures/actg

Per seed: one ACTG run (oracle ``columns`` attributes -> AIM under eps1 -> DP-SGD under eps2;
supervised reward fitted on public labeled rows; disjoint anchor / rl / eval pools) gives two rows
on the same eval-pool attribute rows: ACTG (plain samples of the DP generator) and ACTG-ARL (after
Anchored RL). "RL without anchor" re-runs only the post-processing stages of a copy of that run with
gamma0 = gamma1 = 0 (same DP artifacts, same KL beta). Vanilla DP-FT is its own run (mode vanilla,
the whole eps on DP-SGD). "AIM -> DP-FT features" is its own ACTG run with ``features.generator: dp_ft``
(an LM DP-fine-tuned on the attribute rows under eps1 replaces AIM; its ACTG-ARL texts are the row).
"direct prompting" re-runs synthesize + evaluate on a copy of the ACTG run with ``generator_mode:
direct_prompt`` (the base model prompted with the SAME DP feature rows; the copy's ledger still lists
the ACTG generator's eps2, an over-statement: a standalone direct_prompt run charges eps1 only).
"eps = inf" is its own ACTG run with ``privacy.epsilon: .inf, not_private: true`` (features resampled
from the real rows, LoRA without noise or clipping; its ledger and outputs say NOT PRIVATE).
Every row: the same base model, data, held-out real texts, seed.

Columns: MAUVE (texts and k-means buckets stated), IFAcc by the judge (TF-IDF classifier on held-out
labeled real texts, not the reward) and by the reward, d_JS^f (1-way, base e: judge-read attributes of
the texts vs the oracle attributes of the held-out real texts; and with the judge reading both sides,
the real texts out of fold: evaluation.cross_fitted_reading), downstream macro-F1 (train on
synthetic, test on held-out real, label primary_research_area). mean +- sd over seeds.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from sample_size import note

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SCALES = {
    # tiny random model: checks the plumbing only (numbers mean nothing)
    "smoke": dict(model="tiny-llama", n_records=48, n_eval=40, n_public=40, n_synthetic=9, steps=2, batch=8,
                  seq=96, new_tokens=12, best_of=2, rl_steps=1, max_chars=400, lora=None, lr=0.001),
    # SmolLM2-135M-Instruct sized for ~20-25 min per seed (7 rows: 3 full ACTG runs, vanilla, 2 re-runs) on
    # the idle 2-core machine. NOT measured end to end: estimated from measured CPU-seconds (2 threads, loaded
    # machine, /work/figures/actg_a16/micro_cpu_seconds.log): one DP-SGD step of 16 x 128 tokens 63 CPU-s, HF
    # generation of 12 x 48 tokens 96 CPU-s; total ~2,500 CPU-s per seed at these settings.
    "small": dict(model="smollm2-135m-instruct", n_records=300, n_eval=100, n_public=100, n_synthetic=12, steps=4,
                  batch=8, seq=128, new_tokens=32, best_of=2, rl_steps=1, max_chars=500, lr=0.003,
                  lora={"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}, feature_lm_seq=96),
    # SmolLM2 with generation on vLLM: 150 feature rows split 15 anchors /
    # 15 RL prompts / 120 evaluation texts per system, against 100 held-out real texts.
    "vllm": dict(model="smollm2-135m-instruct", n_records=300, n_eval=100, n_public=100, n_synthetic=150,
                 anchor_share=0.1, rl_share=0.1, steps=8, batch=8, seq=128, new_tokens=48, best_of=4, rl_steps=2,
                 max_chars=500, lr=0.003, engine="vllm",
                 lora={"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj"]}, feature_lm_seq=96),
}
# The same, with the issue's >= 300 evaluation texts per system (360 feature rows: 30 anchors / 30 RL prompts /
# 300 evaluation) read against 300 held-out real texts, so the judge is fitted on three times the labeled rows.
SCALES["vllm300"] = {**SCALES["vllm"], "n_eval": 300, "n_synthetic": 360, "anchor_share": 1 / 12,
                     "rl_share": 1 / 12}

ROWS = ["vanilla DP-FT", "ACTG", "ACTG-ARL", "RL without anchor", "AIM -> DP-FT features", "direct prompting",
        "eps = inf (not private)"]


def paper_data() -> tuple[Path, Path, int]:
    """(private file, declared-public labeled file, private rows) of configs/actg_paper*.yaml, made once
    from the shared corpus (scripts/make_actg_paper_data.py)."""
    import pandas as pd

    from dpsynth_core.actg.paper_data import PAPER_DATA_DIR, write_paper_split

    public, private = PAPER_DATA_DIR / "public_labeled.csv", PAPER_DATA_DIR / "private.csv"
    if not (public.is_file() and private.is_file()):
        public, private = write_paper_split(ROOT / PAPER_DATA_DIR)
    return private, public, len(pd.read_csv(private))


def actg_config(scale: dict, seed: int, run_dir: Path, mode: str = "actg", **update) -> dict:
    private, public, n_private = paper_data()
    generator = {"model": scale["model"], "steps": scale["steps"], "expected_batch_size": scale["batch"],
                 "physical_batch_size": 8, "max_seq_len": scale["seq"], "learning_rate": scale["lr"],
                 "fill_budget": True}
    if scale["lora"]:
        generator["lora"] = scale["lora"]
    return {
        "name": run_dir.name, "mode": mode, "output_dir": str(run_dir),
        # the reward's labeled rows come from the declared-public file; the working set is a public fraction
        # of the private rows not held out (the bundled corpus's published size)
        "data": {"path": str(private), "public_path": str(public), "n_records": scale["n_records"],
                 "sample_fraction": min(1.0, scale["n_records"] / (n_private - scale["n_eval"])),
                 "n_eval": scale["n_eval"], "n_public": scale["n_public"], "max_chars": scale["max_chars"], "seed": 0},
        "privacy": {"epsilon": 4.0, "features_share": 0.5},
        "extractor": {"kind": "columns"}, "reward": {"kind": "supervised"},
        "features": {"n_synthetic": scale["n_synthetic"], "anchor_share": scale.get("anchor_share", 1 / 3),
                     "rl_share": scale.get("rl_share", 1 / 3)},
        "generator": generator,
        "generation": {"max_new_tokens": scale["new_tokens"], "temperature": 0.9, "top_p": 0.95, "batch_size": 12,
                       "seed": seed, "engine": scale.get("engine", "auto")},
        "best_of_n": {"n": scale["best_of"]},
        "rl": {"steps": scale["rl_steps"], "prompts_per_step": 4, "group_size": 2, "anchor_batch_size": 4,
               "max_new_tokens": scale["new_tokens"], "learning_rate": 0.0002, "beta": 0.2, "seed": seed},
        "evaluation": {"mauve": True, "classifier": True},
        **update,
    }


def _row(system: dict) -> dict:
    return {"mauve": system.get("mauve", {}).get("mauve"), "mauve_kmeans_sd": system.get("mauve", {}).get(
                "sd_over_kmeans_seeds"),
            "ifacc_judge": system.get("ifacc_judge"), "ifacc_reward": system.get("ifacc_reward"),
            "djs_f": system.get("djs_text", {}).get("1way_mean"), "djs_f_2way": system.get("djs_text", {}).get(
                "2way_mean"), "djs_f_same_reader": system.get("djs_text_same_reader", {}).get("1way_mean"),
            "f1": system.get("downstream", {}).get("macro_f1"), "n_texts": system["n_texts"],
            "f1_baseline": system.get("downstream", {}).get("constant_macro_f1"),
            "mauve_buckets": system.get("mauve", {}).get("num_buckets"),
            "distinct_2": system["stats"].get("distinct_2")}


def _run(raw: dict) -> dict:
    """Run (or resume) one pipeline; its metrics.json."""
    from dpsynth_core.actg.pipeline import ActgConfig, run_pipeline

    run_dir = run_pipeline(ActgConfig.model_validate(raw), resume=True)
    return json.loads((Path(run_dir) / "metrics.json").read_text())


def _rerun_copy(source: Path, dest: Path, raw: dict, stages: tuple[str, ...]) -> dict:
    """Copy a finished run's DP artifacts, drop ``stages``' outputs and markers, run them with ``raw`` (a copy
    that has started, i.e. has its config, resumes instead)."""
    if not (dest / "config.yaml").is_file():
        shutil.rmtree(dest, ignore_errors=True)
        shutil.copytree(source, dest, ignore=shutil.ignore_patterns("rl", "release", "plots", "metrics.json", ".lock",
                                                                    "synthetic.jsonl", "config.yaml"))
        for stage in stages:
            (dest / "stages" / f"{stage}.done").unlink(missing_ok=True)
    return _run(raw)


def run_seed(scale: dict, seed: int, out: Path, wanted: list[str]) -> dict:
    """The rows in ``wanted`` for one seed (ACTG and ACTG-ARL come from one run; the re-runs need it)."""
    rows, seconds = {}, {}
    t0 = time.perf_counter()
    actg_dir = out / f"actg_s{seed}"
    m = _run(actg_config(scale, seed, actg_dir))
    rows["ACTG"], rows["ACTG-ARL"] = _row(m["systems"]["actg"]), _row(m["systems"]["actg_arl"])
    rows["_features_djs_1way"] = {"aim": m["features"]["djs_1way_mean"]}
    rows["_reward_agreement"] = m.get("reward_agreement_on_heldout_real")
    seconds["actg"] = time.perf_counter() - t0
    if "RL without anchor" in wanted:  # the post-processing stages again on a copy of the same DP artifacts
        t0 = time.perf_counter()
        raw = actg_config(scale, seed, out / f"actg_s{seed}_noanchor")
        raw["rl"].update(gamma0=0.0, gamma1=0.0)
        m = _rerun_copy(actg_dir, out / f"actg_s{seed}_noanchor", raw, ("anchored_rl", "synthesize", "evaluate"))
        rows["RL without anchor"] = _row(m["systems"]["actg_arl"])
        seconds["rl_without_anchor"] = time.perf_counter() - t0
    if "direct prompting" in wanted:  # the base model prompted with the same DP feature rows
        t0 = time.perf_counter()
        raw = actg_config(scale, seed, out / f"actg_s{seed}_direct", generator_mode="direct_prompt")
        m = _rerun_copy(actg_dir, out / f"actg_s{seed}_direct", raw, ("synthesize", "evaluate"))
        rows["direct prompting"] = _row(m["systems"]["direct_prompt"])
        seconds["direct_prompting"] = time.perf_counter() - t0
    if "vanilla DP-FT" in wanted:
        t0 = time.perf_counter()
        m = _run(actg_config(scale, seed, out / f"vanilla_s{seed}", mode="vanilla"))
        rows["vanilla DP-FT"] = _row(m["systems"]["vanilla"])
        seconds["vanilla"] = time.perf_counter() - t0
    if "AIM -> DP-FT features" in wanted:
        t0 = time.perf_counter()
        raw = actg_config(scale, seed, out / f"actg_dpft_features_s{seed}")
        raw["features"].update(generator="dp_ft", lm={"max_seq_len": scale.get("feature_lm_seq", scale["seq"])})
        m = _run(raw)
        rows["AIM -> DP-FT features"] = _row(m["systems"]["actg_arl"])
        rows["_features_djs_1way"]["dp_ft"] = m["features"]["djs_1way_mean"]
        seconds["dp_ft_features"] = time.perf_counter() - t0
    if "eps = inf (not private)" in wanted:
        t0 = time.perf_counter()
        raw = actg_config(scale, seed, out / f"actg_inf_s{seed}", not_private=True)
        raw["privacy"]["epsilon"] = float("inf")
        m = _run(raw)
        assert m["not_private"], "an epsilon = inf run must be marked not private"
        rows["eps = inf (not private)"] = _row(m["systems"]["actg_arl"])
        rows["_features_djs_1way"]["eps_inf"] = m["features"]["djs_1way_mean"]
        seconds["eps_inf"] = time.perf_counter() - t0
    rows["_seconds"] = {k: round(v, 1) for k, v in seconds.items()}
    return rows


def real_text_reference(scale: dict, run_dir: Path, repeats: int = 3) -> dict:
    """What the judge reads from REAL held-out texts it was not fitted on: a TF-IDF judge fitted on one
    half of the held-out texts reads the other half (2-fold, ``repeats`` random splits). Its IFAcc is the
    ceiling a perfect generator could reach under this judge; its d_JS^f the floor. Owner-side, like
    every evaluation here (the held-out texts are outside the DP guarantee)."""
    from dpsynth_core.actg.data_split import load_private_split
    from dpsynth_core.actg.evaluation import cross_fitted_reading, djs
    from dpsynth_core.actg.extractor_base import ifacc_scores
    from dpsynth_core.actg.pipeline import ActgConfig
    from dpsynth_core.actg.run_files import load_run_schema
    from dpsynth_core.actg.supervised import SupervisedExtractor, columns_attributes

    cfg = ActgConfig.model_validate(actg_config(scale, 0, run_dir))
    schema = load_run_schema(cfg, run_dir)
    held = load_private_split(cfg).held_out
    texts = [str(t)[: cfg.data.max_chars] for t in held[cfg.data.text_col]]
    rows = columns_attributes(held, schema)
    ifacc, djs1, same = [], [], []
    for r in range(repeats):
        order = np.random.default_rng(r).permutation(len(texts))  # evaluation split only: not DP randomness
        halves = order[: len(order) // 2], order[len(order) // 2:]
        for fit, read in (halves, halves[::-1]):
            judge = SupervisedExtractor.fit([texts[i] for i in fit], [rows[i] for i in fit], schema, features="tfidf")
            judged = judge.extract([texts[i] for i in read])
            ifacc.append(float(np.mean(ifacc_scores(judged, [rows[i] for i in read], schema.field_names))))
            djs1.append(djs([rows[i] for i in fit], judged, schema.categories())["1way_mean"])
            fit_read = cross_fitted_reading([texts[i] for i in fit], [rows[i] for i in fit], schema)
            same.append(djs(fit_read, judged, schema.categories())["1way_mean"])
    return {"ifacc_judge": (float(np.mean(ifacc)), float(np.std(ifacc))),
            "djs_f": (float(np.mean(djs1)), float(np.std(djs1))),
            "djs_f_same_reader": (float(np.mean(same)), float(np.std(same))), "n_texts": len(texts) // 2,
            "runs": f"{2 * repeats} (2 folds x {repeats} random splits; mean, sd)"}


def _fmt(values: list) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "—"
    return f"{np.mean(vals):.3f} ± {np.std(vals):.3f}"


def _counts(values: list) -> str:
    vals = sorted({v for v in values if v is not None})
    return "/".join(str(v) for v in vals) or "—"


def table(per_seed: list[dict]) -> str:
    """The paper's table; each row with its synthetic-text count and seeds, macro-F1 beside its constant predictor."""
    cols = [("MAUVE", "mauve"), ("IFAcc (judge)", "ifacc_judge"), ("IFAcc (reward)", "ifacc_reward"),
            ("d_JS^f 1-way", "djs_f"), ("d_JS^f 2-way", "djs_f_2way"),
            ("d_JS^f 1-way, judge on both sides", "djs_f_same_reader"), ("downstream macro-F1", "f1"),
            ("constant predictor's macro-F1 (baseline)", "f1_baseline")]
    lines = ["| method | n texts | seeds | " + " | ".join(c for c, _ in cols) + " |", "|---" * (len(cols) + 3) + "|"]
    for row in ROWS:
        seeds = [s[row] for s in per_seed if row in s]
        if seeds:
            lines.append(f"| {row} | {_counts([s.get('n_texts') for s in seeds])} | {len(seeds)} | "
                         + " | ".join(_fmt([s.get(k) for s in seeds]) for _, k in cols) + " |")
    lines.append(note("synthetic texts per seed and row, against the held-out real texts of the run", len(per_seed),
                      "the constant predictor's macro-F1 on the same test texts") + "; mean ± sd over seeds")
    return "\n".join(lines)


def plot(per_seed: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [("mauve", "MAUVE"), ("ifacc_judge", "IFAcc (judge)"), ("ifacc_reward", "IFAcc (reward)"),
            ("djs_f", "d_JS^f (1-way, base e)"), ("djs_f_same_reader", "d_JS^f, judge on both sides"),
            ("f1", "downstream macro-F1")]
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 4))
    for ax, (k, title) in zip(axes, keys):
        means, sds = [], []
        for row in ROWS:
            vals = [s[row][k] for s in per_seed if row in s and s[row][k] is not None]
            means.append(np.mean(vals) if vals else np.nan)
            sds.append(np.std(vals) if vals else 0.0)
        ax.bar(range(len(ROWS)), means, yerr=sds, capsize=3, color="tab:blue")
        ax.set_xticks(range(len(ROWS)))
        ax.set_xticklabels(ROWS, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "actg_table.png", dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", choices=sorted(SCALES), default="small")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=Path("/work/figures/actg"))
    ap.add_argument("--rows", nargs="+", choices=ROWS, default=ROWS, help="rows to run (default: all)")
    ap.add_argument("--real-reference", action="store_true",
                    help="only the judge on real held-out texts (2-fold): IFAcc ceiling and d_JS^f floor")
    ap.add_argument("--reevaluate", action="store_true",
                    help="run the evaluate stage again on the seeds' finished runs (after a metric was added)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.reevaluate:
        for seed in args.seeds:
            for run in [*args.out.glob(f"*_s{seed}/stages/evaluate.done"),
                        *args.out.glob(f"*_s{seed}_*/stages/evaluate.done")]:
                run.unlink()
                (run.parent.parent / "metrics.json").unlink(missing_ok=True)
    scale = SCALES[args.scale]
    if args.real_reference:
        print(json.dumps(real_text_reference(scale, args.out / f"actg_s{args.seeds[0]}")))
        return
    per_seed = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        per_seed.append(run_seed(scale, seed, args.out, args.rows))
        print(f"seed {seed}: {time.perf_counter() - t0:.0f} s", flush=True)
        (args.out / "results.json").write_text(json.dumps({"scale": args.scale, "settings": scale,
                                                           "per_seed": per_seed}, indent=2))
        print(table(per_seed), flush=True)
    plot(per_seed, args.out)
    extra = {k: [s[k] for s in per_seed] for k in ("_features_djs_1way", "_reward_agreement", "_seconds")}
    print(f"scale {args.scale}: {json.dumps(scale)}; seeds {args.seeds}")
    runs = len(per_seed)
    print(f"seconds per run, per seed: {extra['_seconds']} {note(f'{runs} seeds, one run each', runs)}")
    print(f"feature table vs real private attributes, 1-way d_JS (base e): {extra['_features_djs_1way']} "
          + note(f"{scale['n_records']} private rows per seed", runs))
    print(f"reward model agreement with oracle labels on held-out real texts: {extra['_reward_agreement']} "
          + note(f"{scale['n_eval']} held-out real texts per seed", runs))


if __name__ == "__main__":
    main()
