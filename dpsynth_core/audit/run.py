"""``run_dpsgd_audit``: one DP-SGD training run with canaries, scored and turned into an epsilon bound.

The run is the config's own stage: the same model, LoRA, clipping, batch, steps and the sigma
that ``plan_privacy`` calibrates for ``config.epsilon`` on the training set (data + included
canaries) -- what ``dpsynth train`` would use. It runs in-process on one worker (noise and
sampling are the same maths for any worker count). Every DP draw (canary inclusion, Poisson
sampling, noise) comes from OS entropy. Outputs are owner-side reports: they name which
canaries were included, and the scores come from the private training data.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpsynth_core.audit.bound import audit_status, bound_by_guesses, epsilon_lower_bound, largest_reachable_bound
from dpsynth_core.audit.canaries import CanarySet, draw_canaries
from dpsynth_core.audit.config import AuditSettings
from dpsynth_core.dpsgd.config import DpSgdConfig, TrainExample
from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.randomness import secret_seed, secure_rng


@dataclass
class AuditResult:
    """What the audit found; ``to_summary()`` is the JSON written next to the plot."""

    canaries: int
    included: int
    guesses: int
    correct: int
    epsilon_lower_bound: float
    claimed_epsilon: float
    largest_reachable_bound: float  # all guesses right: a claim at or above it cannot be refuted
    delta: float
    confidence: float
    noise_multiplier: float
    sampling_rate: float
    steps: int
    model: str
    private: bool
    wall_seconds: float
    scores_in: list[float] = field(default_factory=list)
    scores_out: list[float] = field(default_factory=list)
    curve: list[dict] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``failed`` (claim refuted), ``passed``, or ``inconclusive`` (this audit could not have failed)."""
        return audit_status(self.epsilon_lower_bound, self.claimed_epsilon, self.largest_reachable_bound)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_summary(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k not in ("scores_in", "scores_out", "curve")}
        out["status"] = self.status
        out["false_alarm_rate"] = round(1.0 - self.confidence, 6)
        out["reading"] = (
            f"failed: the bound refutes the claimed epsilon; a mechanism that meets its claim is reported failed "
            f"with probability at most {1 - self.confidence:.0%}. passed: not refuted (the audit is a lower bound). "
            f"inconclusive: the claimed epsilon is at or above the largest bound this m and these guesses can "
            f"reach ({self.largest_reachable_bound:.3f}), so the audit could not have failed; raise m")
        if not self.private:
            out["warning"] = "NOT PRIVATE: noise switched off (test-only mode); the claimed epsilon does not hold"
        return out


def _canary_losses(engine, canaries: Sequence[TrainExample]) -> np.ndarray:
    """Mean target-token loss of each canary under the engine's current model (no gradients)."""
    import torch

    from dpsynth_core.dpsgd.data import collate, per_example_loss, tokenize_examples

    rows = tokenize_examples(canaries, engine.tokenizer, engine.config.max_seq_len)
    model = engine.model
    was_training = model.training
    model.eval()
    losses = []
    try:
        with torch.no_grad():
            size = engine.config.physical_batch_size
            for start in range(0, len(rows), size):
                batch = {k: v.to(engine.device) for k, v in collate(rows[start:start + size], engine.pad_id).items()}
                out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                            position_ids=batch["position_ids"])
                losses.append(per_example_loss(out.logits, batch["labels"]).float().cpu().numpy())
    finally:
        model.train(was_training)
    return np.concatenate(losses)


def count_correct(scores: np.ndarray, included: np.ndarray, k_in: int, k_out: int) -> int:
    """Right guesses when the k_in highest scores are called "in" and the k_out lowest "out"."""
    order = np.argsort(-scores, kind="stable")
    ranked = np.asarray(included, dtype=bool)[order]
    return int(ranked[:k_in].sum() + (~ranked[len(ranked) - k_out:]).sum())


def _check_config(config: DpSgdConfig, settings: AuditSettings, allow_test_only: bool) -> None:
    if settings.noise == "off" and not allow_test_only:
        raise ConfigError("field 'audit.noise': 'off' is a test-only mode (the run would not be private); "
                          "it needs the explicit test-only flag")
    from dpsynth_core.dpsgd.trainer import test_only_knobs

    knobs = test_only_knobs(config)
    if knobs:
        raise ConfigError(f"an audit runs the real mechanism (OS-entropy sampling and noise, every step); "
                          f"remove the test knobs: {'; '.join(knobs)}")


def run_dpsgd_audit(
    examples: Sequence[TrainExample],
    config: DpSgdConfig,
    settings: AuditSettings,
    *,
    allow_test_only: bool = False,
    progress: bool = False,
) -> AuditResult:
    """Train ``config`` on ``examples`` + secretly included canaries and bound epsilon from below."""
    from dpsynth_core.config.placement import apply_torch_threads
    from tqdm.auto import tqdm

    from dpsynth_core.dpsgd.budget import plan_privacy
    from dpsynth_core.dpsgd.engine import DpSgdEngine
    from dpsynth_core.models import load_tokenizer, resolve_model_dir

    _check_config(config, settings, allow_test_only)
    started = time.monotonic()
    apply_torch_threads(config.torch_threads)
    # q and sigma from the public size (records + m/2 expected canaries), fixed before any canary is
    # drawn: the number included is secret, and the audited mechanism must not depend on it
    public = config.model_copy(update={"public_num_units": len(examples) + settings.canaries // 2})
    plan = plan_privacy(public, examples)
    sigma = 0.0 if settings.noise == "off" else plan.noise_multiplier
    resolve_model_dir(config.model)  # cache the model first: the tokenizer then loads from it, not from a GGUF
    rng = secure_rng()
    canaries: CanarySet = draw_canaries(load_tokenizer(config.model), settings.canaries, settings.canary_tokens,
                                        examples, rng)
    training_set = list(examples) + canaries.members
    engine = DpSgdEngine(training_set, public, noise_multiplier=sigma, sampling_seed=secret_seed(62))
    before = _canary_losses(engine, canaries.examples)
    for _ in tqdm(range(config.steps), desc="audit dp-sgd", disable=not progress, dynamic_ncols=True):
        engine.train_step()
    after = _canary_losses(engine, canaries.examples)

    scores = before - after  # how much training lowered each canary's loss: members should drop more
    k_in, k_out = settings.k_in, settings.k_out
    correct = count_correct(scores, canaries.included, k_in, k_out)
    ranked = canaries.included[np.argsort(-scores, kind="stable")]
    return AuditResult(
        canaries=settings.canaries,
        included=int(canaries.included.sum()),
        guesses=k_in + k_out,
        correct=correct,
        epsilon_lower_bound=epsilon_lower_bound(settings.canaries, k_in + k_out, correct, plan.delta,
                                                settings.confidence),
        claimed_epsilon=plan.target_epsilon,
        largest_reachable_bound=largest_reachable_bound(settings.canaries, k_in + k_out, plan.delta, settings.confidence),
        delta=plan.delta,
        confidence=settings.confidence,
        noise_multiplier=sigma,
        sampling_rate=plan.sampling_rate,
        steps=config.steps,
        model=config.model,
        private=settings.noise != "off",
        wall_seconds=time.monotonic() - started,
        scores_in=scores[canaries.included].tolist(),
        scores_out=scores[~canaries.included].tolist(),
        curve=bound_by_guesses(ranked, settings.canaries, plan.delta, settings.confidence),
    )


def write_audit_report(result: AuditResult, out_dir: Path) -> tuple[Path, Path]:
    """``audit.json`` (summary) and ``audit.png`` (scores in vs out; bound vs guesses) in ``out_dir``."""
    import json

    from dpsynth_core.audit.plot import save_audit_plot

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = out_dir / "audit.json"
    summary.write_text(json.dumps(result.to_summary(), indent=1), encoding="utf-8")
    return summary, save_audit_plot(result, out_dir / "audit.png")
