"""End-to-end WASP / Aug-PE run (Ray-free): config -> data split -> ledger -> runner -> outputs.

The drivers in ``ray_jobs/`` pass a ``make_llms`` factory (Ray actors, Serve handles, ...);
this module never imports Ray.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dpsynth_core.config import load_config
from dpsynth_core.errors import ConfigError
from dpsynth_core.pe.callbacks import Callback, CheckpointCallback, MetricsLogger
from dpsynth_core.pe.checkpoint import RunState, VoteStore, load_latest_checkpoint
from dpsynth_core.pe.config import PEConfig, PLMConfig
from dpsynth_core.pe.data_split import split_data
from dpsynth_core.pe.embedding import Embedding, SentenceEmbedding
from dpsynth_core.pe.evaluate import evaluate_synthetic
from dpsynth_core.pe.llm import LLM
from dpsynth_core.pe.prompts import load_prompts
from dpsynth_core.pe.runner import PERunner, PrivateData
from dpsynth_core.runs import StageMarkers, announce_finished, open_run_dir
from dpsynth_core.runs.files import atomic_write_text
from dpsynth_core.runs.lock import locked_run

log = logging.getLogger(__name__)
LLMFactory = Callable[[Sequence[PLMConfig]], list[LLM]]


def load_pe_config(path: str | Path, method: str) -> PEConfig:
    cfg = load_config(path, PEConfig)
    if cfg.method != method:
        raise ConfigError(f"{path}: field 'method' is '{cfg.method}' but this driver runs '{method}'")
    return cfg


def prepare_run_dir(cfg: PEConfig, resume: bool) -> Path:
    """``cfg.run_dir`` under the rerun rule of ``runs/run_dir.py``: another config there is refused (it would
    mix two runs' privacy accounting), naming the changed keys; ``resume=False`` moves an old run aside."""
    return open_run_dir(Path(cfg.run_dir), cfg.model_dump(mode="json"), resume=resume)


def resolve_delta(cfg: PEConfig) -> float:
    """The run's delta: the configured value (the paper's 1e-5 by default), or 1/(M ln M) for the
    configured (public) M = data.num_private -- never the drawn set's size, which is private.
    Either must be below 1/M."""
    import math

    from dpsynth_core.privacy import check_delta_for_size

    m = cfg.data.num_private
    if cfg.delta == "1/(M ln M)":  # the small-M rule, by name (m * delta = 1/ln M: a weak guarantee)
        return 1.0 / (m * math.log(m))
    return check_delta_for_size(cfg.delta, m, "delta")


REFERENCE_LEDGER_BUDGET = 1e6  # nominal: the ledger needs a finite budget; a reference run records no event


def open_ledger(cfg: PEConfig, run_dir: Path):
    """The run's ledger (see :func:`resolve_delta`); an epsilon = inf reference run's ledger is
    marked "not private" before any vote reads private data."""
    from dpsynth_core.privacy import LEDGER_FILE, PrivacyLedger
    from dpsynth_core.privacy.reference_runs import mark_reference_run

    if (run_dir / LEDGER_FILE).is_file():
        return PrivacyLedger.open(run_dir)
    budget = REFERENCE_LEDGER_BUDGET if cfg.is_reference else cfg.epsilon
    ledger = PrivacyLedger.create(run_dir, cfg.dataset_name, epsilon_budget=budget, delta=resolve_delta(cfg),
                                  public_size=cfg.data.num_private)
    mark_reference_run(ledger, f"{cfg.method}.reference", cfg.epsilon)
    return ledger


def write_synthetic(run_dir: Path, state: RunState, names: list[str]) -> Path:
    pop = state.population
    rows = [json.dumps({"text": t, "label": y, "plm": names[k], "iteration": b}, ensure_ascii=False)
            for t, y, k, b in zip(pop.texts, pop.labels, pop.plm_ids, pop.born)]
    path = run_dir / "synthetic.jsonl"
    atomic_write_text(path, "\n".join(rows) + "\n")
    return path


def plot_weights(run_dir: Path, state: RunState, names: list[str]) -> Path | None:
    rows = [r for r in state.history if "plm_weights" in r]
    if len(names) < 2 or not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    its = [r["iteration"] for r in rows]
    w = np.array([r["plm_weights"] for r in rows])
    fig, ax = plt.subplots(figsize=(5, 3.2))
    for k, name in enumerate(names):
        ax.plot(its, w[:, k], marker="o", label=name)
    ax.set(xlabel="iteration", ylabel="PLM weight w_k", ylim=(0, 1), title="WASP PLM weights")
    ax.legend()
    fig.tight_layout()
    path = run_dir / "plm_weights.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def execute(cfg: PEConfig, run_dir: Path, llms: Sequence[LLM], private: PrivateData, classes: list[str],
            embedding: Embedding, callbacks: Sequence[Callback] = (), resume: bool = True) -> RunState:
    """Run the loop in ``run_dir`` (resuming from its latest checkpoint when ``resume``)."""
    ledger = open_ledger(cfg, run_dir)
    cbs = [MetricsLogger(run_dir), CheckpointCallback(run_dir), *callbacks]
    runner = make_runner(cfg, llms, embedding, ledger, classes, cbs, run_dir)
    state = load_latest_checkpoint(run_dir) if resume else None
    if state is not None:
        log.info("resuming %s from iteration %d", cfg.method, state.iteration)
    return runner.run(private, state)


def make_runner(cfg: PEConfig, llms: Sequence[LLM], embedding: Embedding, ledger, classes: list[str],
                callbacks: Sequence[Callback], run_dir: Path) -> PERunner:
    return PERunner(cfg, llms, embedding, load_prompts(cfg.prompts), ledger, classes, callbacks,
                    vote_store=VoteStore(run_dir))


BASELINE_ROUND = 10_000  # generation-seed round of the zero-shot baseline (distinct from the run's rounds)


def run_baselines(cfg: PEConfig, run_dir: Path, llms: Sequence[LLM], embedding: Embedding, private: PrivateData,
                  classes: list[str], test_emb: np.ndarray, test_labels: list[str], num_synthetic: int) -> dict:
    """Reference points for the synthetic set, tested on the same real held-out set:

    * ``zero_shot``: ``num_synthetic`` samples from the same PLMs (equal shares) with the zero-shot
      prompt only -- no private data at all (epsilon 0). Written to ``baseline_zero_shot.jsonl``.
    * ``private_only``: the classifier trained on the M private records themselves. NOT differentially
      private: a non-DP reference of what the few private samples are worth; only its test
      accuracy (an aggregate) is reported, never a record.
    """
    from dpsynth_core.pe.evaluate import downstream_accuracy
    from dpsynth_core.privacy import PrivacyLedger

    path = run_dir / "baseline_zero_shot.jsonl"
    names = [p.display_name for p in cfg.plms]
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] if path.is_file() else []
    seconds = None
    if len(rows) != num_synthetic:
        ledger = PrivacyLedger.open(run_dir)
        runner = make_runner(cfg, llms, embedding, ledger, classes, (), run_dir)
        pop, seconds, _ = runner.zero_shot(num_synthetic, rnd=BASELINE_ROUND)
        rows = [{"text": t, "label": y, "plm": names[k]} for t, y, k in zip(pop.texts, pop.labels, pop.plm_ids)]
        atomic_write_text(path, "\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n")
    zs_emb = embedding.encode([r["text"] for r in rows])
    zero_shot = evaluate_synthetic(zs_emb, [r["label"] for r in rows], test_emb, test_labels,
                                   with_mauve=cfg.mauve, seed=cfg.seed)
    zero_shot.update(epsilon=0.0, generate_seconds=None if seconds is None else round(seconds, 2))
    priv_emb = embedding.encode(private.texts)
    private_only = {
        "n_train": len(private.texts), "dp": False,
        "accuracy": downstream_accuracy(priv_emb, private.labels, test_emb, test_labels, cfg.seed),
    }
    return {"zero_shot": zero_shot, "private_only": private_only}


def check_plm_placements(plms) -> None:
    """In-process PLMs (``backend: hf``) resolve their placement here; Ray PLMs in their own actor,
    which asked Ray for the GPU (``ray_jobs.pe_backends.plm_resources``)."""
    from dpsynth_core.config.placement import resolve_placement

    for k, plm in enumerate(plms):
        if plm.backend == "hf":
            resolve_placement(plm.device, plm.dtype, section=f"plms[{k}].")


@locked_run(lambda config_path, method, *_, **__: load_pe_config(config_path, method).run_dir)  # one process per run
def run_pipeline(config_path: str | Path, method: str, make_llms: LLMFactory, resume: bool = True,
                 callbacks: Sequence[Callback] = ()) -> Path:
    """Everything a driver does; returns the run directory (synthetic.jsonl, metrics.json,
    ledger.sqlite, checkpoints/, metrics.jsonl, plm_weights.png)."""
    config_path = Path(config_path)
    cfg = load_pe_config(config_path, method)
    run_dir = prepare_run_dir(cfg, resume)
    if StageMarkers(run_dir).done(method):
        announce_finished(run_dir)
        return run_dir
    check_plm_placements(cfg.plms)  # a forced device this process cannot see fails before the data is read
    private, test_texts, test_labels, classes = split_data(cfg)
    embedding = SentenceEmbedding(cfg.embedder)
    llms = make_llms(cfg.plms)
    test_emb = embedding.encode(test_texts) if test_texts and (cfg.evaluate or cfg.baselines) else None
    baselines = None
    try:
        t0 = time.perf_counter()
        state = execute(cfg, run_dir, llms, private, classes, embedding, callbacks, resume=True)
        seconds = time.perf_counter() - t0
        if cfg.baselines and test_emb is not None:
            baselines = run_baselines(cfg, run_dir, llms, embedding, private, classes, test_emb, test_labels,
                                      len(state.population))
    finally:
        for llm in llms:
            llm.close()
    names = [p.display_name for p in cfg.plms]
    write_synthetic(run_dir, state, names)
    plot_weights(run_dir, state, names)
    from dpsynth_core.privacy import PrivacyLedger

    ledger = PrivacyLedger.open(run_dir)
    metrics = {"method": method, "classes": classes, "num_private_expected": cfg.data.num_private,
               "num_synthetic": len(state.population), "iterations": cfg.iterations,
               "run_seconds": round(seconds, 2), "plms": names, "history": state.history,
               "privacy": ledger.to_dict()}
    if cfg.evaluate and test_emb is not None:
        synth_emb = embedding.encode(state.population.texts)
        metrics["evaluation"] = evaluate_synthetic(synth_emb, state.population.labels, test_emb, test_labels,
                                                   with_mauve=cfg.mauve, seed=cfg.seed)
    if baselines is not None:
        metrics["baselines"] = baselines
    atomic_write_text(run_dir / "metrics.json", json.dumps(metrics, indent=2, default=float))  # owner-only
    from dpsynth_core.runs.release import write_release

    plot = run_dir / "plm_weights.png"  # from noisy votes only: post-processing
    write_release(run_dir, {"synthetic.jsonl": run_dir / "synthetic.jsonl", **({plot.name: plot} if plot.is_file() else {})},
                  ledger=ledger, method=method)
    StageMarkers(run_dir).mark(method)  # finished: a rerun says so and does nothing (runs/run_dir.py)
    return run_dir
