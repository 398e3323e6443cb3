"""``train_dp_lora``: the public entry of the DP-SGD engine (in-process; a driver-given runner for
num_workers > 1).

Order of operations, which is the privacy contract of a stage:
 1. validate the config and plan the noise (``budget.plan_privacy``), ``ledger.check``, then
    ``ledger.hold`` the planned event (a concurrent run on the same ledger is refused here, not
    after training; given back on failure); a config with test-only knobs marks the ledger
    "not private";
 2. train (resuming from ``output_dir/checkpoint`` only when it ran under this very config AND
    privacy plan; otherwise the checkpoint is deleted and the resume refused);
 3. ``ledger.record`` ONE DpSgdEvent for the steps actually run (it replaces the reservation), then write the outputs
    (adapter, training-curve PNG, summary) by atomic rename, and delete the checkpoint.

The library does not import Ray: with ``config.num_workers > 1`` the caller passes a
``DistributedRunner`` (the driver's ``ray_jobs.dp_finetune.run_dp_finetune``), and the examples
as an ``ExampleSource`` its workers load themselves (``sources.py``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from dpsynth_core.dpsgd.budget import PrivacyPlan, calibrated_to_reservation, plan_privacy, public_size
from dpsynth_core.dpsgd.checkpoint import (
    TrainState,
    check_resumable,
    config_fingerprint,
    discard_checkpoint,
    is_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from dpsynth_core.dpsgd.config import DpSgdConfig, TrainExample, TrainResult
from dpsynth_core.dpsgd.sources import ExampleSource, as_source
from dpsynth_core.errors import ConfigError
from dpsynth_core.runs.files import atomic_dir

ADAPTER_DIRNAME = "adapter"
MERGED_DIRNAME = "merged"
CHECKPOINT_DIRNAME = "checkpoint"
CURVE_FILENAME = "training_curve.png"
SUMMARY_FILENAME = "dp_training.json"
_EPS_POINTS = 10  # epsilon is evaluated at about this many steps (a PLD call costs ~0.7 s)


class DistributedRunner(Protocol):
    """Runs a DP-SGD stage on ``config.num_workers`` workers; same outputs as ``train_dp_lora``.

    It ships only ``source`` (public) to the workers, which call ``source.load()``.
    """

    def __call__(self, source: ExampleSource, config: DpSgdConfig, *, output_dir: Path, ledger=None,
                 stage: str = "dpsgd", per_example_penalty=None, progress: bool = True,
                 resume: bool = True) -> TrainResult: ...


def test_only_knobs(config: DpSgdConfig) -> list[str]:
    """Config fields that make a run reproducible or interrupted on purpose: tests only."""
    knobs = []
    if config.sampling_seed is not None:
        knobs.append("the seed of Poisson sampling and noise is pinned in the config (test only)")
    if config.stop_after_steps is not None:
        knobs.append("stop_after_steps is set (a simulated crash for tests)")
    return knobs


def mark_test_only_knobs(config: DpSgdConfig, ledger, stage: str) -> None:
    """Before training: the ledger says "not private" for a run with test-only knobs."""
    if ledger is not None:
        for reason in test_only_knobs(config):
            ledger.mark_not_private(stage, reason)


def prepare_stage(source: ExampleSource, config: DpSgdConfig, *, ledger, stage: str
                  ) -> tuple[list[TrainExample], PrivacyPlan, str]:
    """(examples, plan, checkpoint identity): load, plan and check the budget, reserve it in the
    ledger (given back by ``train_dp_lora`` unless recorded), mark knobs. A reservation the ledger
    already holds for ``stage`` (the run loop's, adopted) is used: the noise is the reserved event's."""
    examples = source.load()
    plan = plan_privacy(config, examples, ledger=ledger, stage=stage)
    reserved = ledger.held_event(stage) if ledger is not None else None
    if reserved is not None:
        plan = calibrated_to_reservation(plan, reserved)
    elif ledger is not None:  # of two runs racing for one budget, the loser stops here, before training
        ledger.hold(stage, plan.event())
    mark_test_only_knobs(config, ledger, stage)
    return examples, plan, config_fingerprint(config, plan)


def new_sampling_seed(config: DpSgdConfig) -> int:
    """A fresh secret seed (OS entropy) unless the config pins one (tests; marks the run not private)."""
    from dpsynth_core.privacy.randomness import secret_seed

    return int(config.sampling_seed) if config.sampling_seed is not None else secret_seed(62)


def epsilon_due(step: int, total: int) -> bool:
    return step == total or step % max(1, total // _EPS_POINTS) == 0


def epsilon_schedule(plan: PrivacyPlan, start_step: int = 0) -> dict[int, float]:
    """The epsilons ``run_steps`` reports from ``start_step`` on (each due step, and the start for the
    progress bar): public figures of the plan. A driver computes them once for its Ray Train workers,
    which then need no accountant (each would import dp_accounting and build the same PLD)."""
    due = [s for s in range(start_step + 1, plan.steps + 1) if epsilon_due(s, plan.steps)]
    return {s: plan.epsilon_after(s) for s in ([start_step] if start_step else []) + due}


def run_steps(engine, plan: PrivacyPlan, state: TrainState, config: DpSgdConfig, *, on_checkpoint, progress: bool,
              is_main: bool = True, epsilons: dict[int, float] | None = None) -> bool:
    """Run logical steps until ``config.steps`` (True) or ``stop_after_steps`` (False). ``epsilons``: the
    driver's ``epsilon_schedule`` (a step it lacks is computed here)."""
    from tqdm.auto import tqdm

    def epsilon_after(step: int) -> float:
        return epsilons[step] if epsilons is not None and step in epsilons else plan.epsilon_after(step)

    bar = tqdm(total=config.steps, initial=engine.step, desc="dp-sgd", disable=not (progress and is_main), dynamic_ncols=True)
    last_eps = epsilon_after(engine.step) if engine.step else 0.0
    try:
        while engine.step < config.steps:
            if config.stop_after_steps is not None and engine.step >= config.stop_after_steps:
                if not config.checkpoint_every:
                    on_checkpoint(state)
                return False
            stats = engine.train_step()
            step = stats["step"]
            eps = epsilon_after(step) if epsilon_due(step, config.steps) else None
            if eps is not None:
                last_eps = eps
            state.step = step
            # no Poisson batch size here: it is private (un-noised) and the history is written to disk
            state.history.append({"step": step, "loss": stats["loss"], "epsilon": eps})
            bar.update(1)
            bar.set_postfix(loss=f"{stats['loss']:.3f}", eps=f"{last_eps:.3f}/{plan.target_epsilon:g}")
            if config.checkpoint_every and step % config.checkpoint_every == 0 and step < config.steps:
                on_checkpoint(state)
    finally:
        bar.close()
    return True


def finalize_run(
    *,
    config: DpSgdConfig,
    plan: PrivacyPlan,
    state: TrainState,
    output_dir: Path,
    write_adapter: Callable[[Path], None],
    ledger=None,
    stage: str = "dpsgd",
    num_workers: int = 1,
) -> TrainResult:
    """Record the ledger event once, then publish adapter, curve and summary atomically."""
    from dpsynth_core.dpsgd.plots import save_training_curve

    steps_run = state.step
    epsilon = plan.epsilon_after(steps_run)
    # the public size m, never the count a secret subsample drew (``n_units`` of the plan is private)
    n_public = public_size(config, plan.n_units)
    if ledger is not None:
        # Recorded before anything trained is written: an output never exists unaccounted.
        ledger.record(
            stage,
            plan.event(steps_run),
            details={"model": config.model, "clipping": config.clipping, "max_grad_norm": config.max_grad_norm,
                     "user_level": plan.user_level, "n_units": n_public, "num_workers": num_workers},
        )
    summary = {
        "base_model": config.model,
        "stage": stage,
        "steps": steps_run,
        "epsilon": epsilon,
        "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
        "sampling_rate": plan.sampling_rate,
        "accountant": plan.accountant,
        "user_level": plan.user_level,
        "n_units": n_public,
        "num_workers": num_workers,
        "test_only_knobs": test_only_knobs(config),
        "config": config.model_dump(mode="json", exclude={"sampling_seed"}),
    }

    def write(d: Path) -> None:
        write_adapter(d)
        (d / SUMMARY_FILENAME).write_text(json.dumps(summary, indent=1), encoding="utf-8")

    output_dir = Path(output_dir)
    adapter_dir = atomic_dir(output_dir / ADAPTER_DIRNAME, write)
    history = state.history
    curve = save_training_curve(history, output_dir / CURVE_FILENAME, title=f"DP-SGD LoRA on {config.model} (eps={epsilon:.2f})")
    (output_dir / "history.json").write_text(json.dumps(history), encoding="utf-8")
    merged = None
    if config.merge_adapter:
        merged = atomic_dir(output_dir / MERGED_DIRNAME, lambda d: save_merged(config.model, adapter_dir, d))
    discard_checkpoint(output_dir / CHECKPOINT_DIRNAME)  # finished: nothing to resume, no seed left behind
    return TrainResult(
        adapter_dir=adapter_dir,
        steps=steps_run,
        epsilon=epsilon,
        noise_multiplier=plan.noise_multiplier,
        history=history,
        sampling_rate=plan.sampling_rate,
        delta=plan.delta,
        curve_png=curve,
        merged_dir=merged,
        completed=True,
    )


def resume_state(output_dir: Path, plan: PrivacyPlan, fingerprint: str):
    """(adapter, optimizer, TrainState) of ``output_dir/checkpoint`` or None.

    A checkpoint of another config or privacy plan is deleted (it holds the secret seed) and the
    resume refused with a ConfigError that says which privacy figures changed."""
    ckpt = Path(output_dir) / CHECKPOINT_DIRNAME
    if not is_checkpoint(ckpt):
        discard_checkpoint(ckpt)  # a partial one is of no use and may hold the seed
        return None
    adapter, optimizer, state = load_checkpoint(ckpt)
    try:
        check_resumable(state, plan, fingerprint, ckpt)
    except ConfigError:
        discard_checkpoint(ckpt)
        raise
    return adapter, optimizer, state


def new_train_state(seed: int, plan: PrivacyPlan, fingerprint: str) -> TrainState:
    return TrainState(0, seed, plan.noise_multiplier, plan.sampling_rate, plan.delta, fingerprint, [],
                      accountant=plan.accountant)


def train_dp_lora(
    examples: Sequence[TrainExample] | ExampleSource,
    config: DpSgdConfig,
    *,
    output_dir: Path,
    ledger=None,
    stage: str = "dpsgd",
    per_example_penalty=None,
    progress: bool = True,
    resume: bool = True,
    runner: DistributedRunner | None = None,
) -> TrainResult:
    """DP-SGD LoRA fine-tuning with (epsilon, delta) = (config.epsilon, ledger delta or config.delta).

    ``examples``: the records, or an ``ExampleSource`` (needed for num_workers > 1, whose workers
    load it themselves). ``per_example_penalty(logits, batch) -> Tensor[B]`` is added to each
    row's loss before clipping; it must depend on that row only. With ``config.num_workers > 1``
    the work goes to ``runner`` (the driver passes ``ray_jobs.dp_finetune.run_dp_finetune``).
    Resumes from ``output_dir/checkpoint`` when present and made under the same privacy plan.
    """
    try:
        return _train(as_source(examples), config, output_dir=Path(output_dir), ledger=ledger, stage=stage,
                      per_example_penalty=per_example_penalty, progress=progress, resume=resume, runner=runner)
    finally:
        if ledger is not None:
            ledger.release(stage)  # prepare_stage's reservation, unless finalize_run recorded it


def _train(source: ExampleSource, config: DpSgdConfig, *, output_dir: Path, ledger, stage: str, per_example_penalty,
           progress: bool, resume: bool, runner: DistributedRunner | None) -> TrainResult:
    if config.num_workers > 1:
        if runner is None:
            raise ConfigError(
                f"field 'num_workers': {config.num_workers} workers need a distributed runner; the library does "
                "not start Ray itself: call train_dp_lora(..., runner=ray_jobs.dp_finetune.run_dp_finetune) from "
                "a driver (dpsynth train does), or set num_workers: 1"
            )
        return runner(source, config, output_dir=output_dir, ledger=ledger, stage=stage,
                      per_example_penalty=per_example_penalty, progress=progress, resume=resume)
    from dpsynth_core.config.placement import apply_torch_threads, resolve_placement
    from dpsynth_core.dpsgd.engine import DpSgdEngine

    resolve_placement(config.device, config.dtype)  # device: cuda without a GPU fails before the data is read
    apply_torch_threads(config.torch_threads)
    examples, plan, fingerprint = prepare_stage(source, config, ledger=ledger, stage=stage)
    if not resume:
        discard_checkpoint(output_dir / CHECKPOINT_DIRNAME)  # a fresh start leaves no old seed behind
    restored = resume_state(output_dir, plan, fingerprint) if resume else None
    seed = restored[2].sampling_seed if restored else new_sampling_seed(config)
    engine = DpSgdEngine(
        examples, config, noise_multiplier=plan.noise_multiplier, sampling_seed=seed,
        per_example_penalty=per_example_penalty,
    )
    if restored:
        adapter, optimizer, state = restored
        engine.load_adapter_state(adapter)
        engine.optimizer.load_state_dict(optimizer)
        engine.step = state.step
    else:
        state = new_train_state(seed, plan, fingerprint)

    def checkpoint(st: TrainState) -> None:
        save_checkpoint(output_dir / CHECKPOINT_DIRNAME, engine.adapter_state(), engine.optimizer.state_dict(), st)

    finished = run_steps(engine, plan, state, config, on_checkpoint=checkpoint, progress=progress)
    if not finished:
        return TrainResult(
            adapter_dir=output_dir / CHECKPOINT_DIRNAME, steps=state.step, epsilon=plan.epsilon_after(state.step),
            noise_multiplier=plan.noise_multiplier, history=state.history, sampling_rate=plan.sampling_rate,
            delta=plan.delta, completed=False,
        )
    return finalize_run(
        config=config, plan=plan, state=state, output_dir=output_dir, write_adapter=engine.save_adapter,
        ledger=ledger, stage=stage,
    )


def save_merged(base_model: str, adapter_dir: Path, out: Path) -> None:
    """Base + adapter merged into one plain HF model directory (with tokenizer)."""
    model, tokenizer = load_generator(base_model, adapter_dir)
    merged = model.merge_and_unload()
    merged.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))


def load_generator(base_model: str, adapter_dir: Path | None = None):
    """(model, tokenizer) ready for ``generate()``: the base with the peft adapter, a merged model
    directory, or the bare base when ``adapter_dir`` is None. Eval mode; tokenizer pads left."""
    from dpsynth_core.models import load_causal_lm

    if adapter_dir is None:
        return load_causal_lm(base_model)
    adapter_dir = Path(adapter_dir)
    if not adapter_dir.is_dir():
        raise ConfigError(f"{adapter_dir}: adapter directory not found")
    if not (adapter_dir / "adapter_config.json").is_file():
        if (adapter_dir / "config.json").is_file():  # a merged model
            return load_causal_lm(str(adapter_dir))
        raise ConfigError(f"{adapter_dir}: neither a LoRA adapter (adapter_config.json) nor a model (config.json)")
    from peft import PeftModel

    model, tokenizer = load_causal_lm(base_model)
    model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    return model, tokenizer


def nan_to_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else x
