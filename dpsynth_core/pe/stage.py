"""WASP / Aug-PE's one stage: the iterations of private evolution (resumable: each iteration is a
checkpoint), the baselines and the owner-side metrics. ``make_llms`` (Ray actors, Serve handles, ...)
comes from the driver; this module never imports Ray."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dpsynth_core.pe.callbacks import Callback, CheckpointCallback, MetricsLogger
from dpsynth_core.pe.checkpoint import RunState, VoteStore, load_latest_checkpoint
from dpsynth_core.pe.config import PEConfig, PLMConfig
from dpsynth_core.pe.data_split import split_data
from dpsynth_core.pe.embedding import Embedding, SentenceEmbedding
from dpsynth_core.pe.evaluate import evaluate_synthetic
from dpsynth_core.pe.llm import LLM
from dpsynth_core.pe.prompts import load_prompts
from dpsynth_core.pe.runner import VOTE_STAGE, PERunner, PrivateData
from dpsynth_core.run_loop.reserve import adopt_reservations
from dpsynth_core.runs.files import atomic_write_text

log = logging.getLogger(__name__)
LLMFactory = Callable[[Sequence[PLMConfig]], list[LLM]]


def stage_evolve(cfg: PEConfig, root: str, *, make_llms: LLMFactory, callbacks: Sequence[Callback] = ()) -> dict:
    """Every iteration not yet checkpointed, then synthetic.jsonl, plm_weights.png and metrics.json
    (owner-only). The only stage that reads the private records (the votes, under the ledger's events)."""
    run_dir = Path(root)
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

    metrics = {"method": cfg.method, "classes": classes, "num_private_expected": cfg.data.num_private,
               "num_synthetic": len(state.population), "iterations": cfg.iterations,
               "run_seconds": round(seconds, 2), "plms": names, "history": state.history,
               "privacy": PrivacyLedger.open(run_dir).to_dict()}
    if cfg.evaluate and test_emb is not None:
        synth_emb = embedding.encode(state.population.texts)
        metrics["evaluation"] = evaluate_synthetic(synth_emb, state.population.labels, test_emb, test_labels,
                                                   with_mauve=cfg.mauve, seed=cfg.seed)
    if baselines is not None:
        metrics["baselines"] = baselines
    atomic_write_text(run_dir / "metrics.json", json.dumps(metrics, indent=2, default=float))  # owner-only
    return {"iterations": cfg.iterations, "num_synthetic": len(state.population)}


def plan_votes(cfg: PEConfig, ledger) -> list:
    """The votes' one Gaussian event (T compositions at the calibrated noise, as ``PERunner._record_privacy``
    records it), for the run loop to reserve before the stage runs (``run_loop.reserve``); none for a
    reference run, or once recorded (a resumed run: every iteration is accounted)."""
    from dpsynth_core.privacy.gaussian_histogram import histogram_event

    stage = VOTE_STAGE[cfg.method]
    if cfg.is_reference or any(e.stage == stage for e in ledger.entries()):
        return []
    return [(stage, histogram_event(cfg.epsilon, float(ledger.delta), cfg.iterations)[1])]


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
    """Run the loop in ``run_dir`` (resuming from its latest checkpoint when ``resume``); the run's ledger
    exists already (the run loop, or ``pe.pipeline.open_ledger``, created it)."""
    from dpsynth_core.privacy import PrivacyLedger

    ledger = PrivacyLedger.open(run_dir)
    adopt_reservations(ledger, run_dir, cfg.method)  # the loop reserved the votes (plan_votes): recorded against it
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
