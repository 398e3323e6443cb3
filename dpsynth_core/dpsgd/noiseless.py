"""The DP-SGD engine's LoRA training without noise or clipping: epsilon = inf reference runs only.

A reference run (``privacy.epsilon: .inf`` with ``not_private: true``; ``privacy/reference_runs.py``)
trains exactly as DP-SGD does (same engine, Poisson batches, optimizer, steps, fairness penalty) with
sigma = 0 and one ordinary backward per batch, marks its stage "not private" in the ledger and
records no event (there is no finite epsilon to record). ACTG's generator and DPFairLLM's model use it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

NO_NOISE_GENERATOR = "LoRA fine-tuning without noise (sigma = 0) or clipping (epsilon = inf reference run)"


def no_clipping(model, max_grad_norm: float):
    """A clipper for ``DpSgdEngine`` that sums the batch gradient with one ordinary backward."""
    from dpsynth_core.dpsgd.clipping import BatchGradientSum

    return BatchGradientSum(model, max_grad_norm)


def train_noiseless_lora(examples, config, *, output_dir: Path, ledger, stage: str, per_example_penalty=None):
    """The DP-SGD engine's LoRA training with sigma = 0 and no clipping; marks ``stage`` not private.

    Writes ``output_dir/adapter`` (peft adapter + dp_training.json with noise_multiplier 0) and
    returns a ``TrainResult`` (epsilon inf)."""
    from dpsynth_core.config.placement import apply_torch_threads

    from dpsynth_core.dpsgd.budget import sampling_rate
    from dpsynth_core.dpsgd.config import TrainResult
    from dpsynth_core.dpsgd.engine import DpSgdEngine
    from dpsynth_core.dpsgd.plots import save_training_curve
    from dpsynth_core.dpsgd.trainer import ADAPTER_DIRNAME, CURVE_FILENAME, SUMMARY_FILENAME
    from dpsynth_core.privacy.randomness import secret_seed
    from dpsynth_core.runs.files import atomic_dir

    ledger.mark_not_private(stage, NO_NOISE_GENERATOR)
    apply_torch_threads(config.torch_threads)
    engine = DpSgdEngine(examples, config, noise_multiplier=0.0, sampling_seed=secret_seed(62),
                         clipper_factory=no_clipping, per_example_penalty=per_example_penalty)
    history = []
    while engine.step < config.steps:
        stats = engine.train_step()
        history.append({"step": stats["step"], "loss": stats["loss"], "epsilon": None})
    q = sampling_rate(config, len(engine.units))
    summary = {"base_model": config.model, "stage": stage, "steps": engine.step, "epsilon": "inf",
               "noise_multiplier": 0.0, "clipping": "none", "sampling_rate": q, "not_private": NO_NOISE_GENERATOR,
               "config": config.model_dump(mode="json", exclude={"sampling_seed", "epsilon"})}

    def write(d: Path) -> None:
        engine.save_adapter(d)
        (d / SUMMARY_FILENAME).write_text(json.dumps(summary, indent=1), encoding="utf-8")

    output_dir = Path(output_dir)
    adapter_dir = atomic_dir(output_dir / ADAPTER_DIRNAME, write)
    curve = save_training_curve(history, output_dir / CURVE_FILENAME, title=f"LoRA on {config.model} (no noise)")
    (output_dir / "history.json").write_text(json.dumps(history), encoding="utf-8")
    return TrainResult(adapter_dir=adapter_dir, steps=engine.step, epsilon=math.inf, noise_multiplier=0.0,
                       history=history, sampling_rate=q, delta=float(ledger.delta), curve_png=curve, merged_dir=None,
                       completed=True)
