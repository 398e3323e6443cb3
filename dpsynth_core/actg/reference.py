"""ACTG's non-DP references and the "direct prompting" ablation: what each spends, on the ledger.

epsilon = inf (``privacy.epsilon: .inf`` with ``not_private: true``; refused otherwise, see
``privacy/reference_runs.py``): the paper's "no noise" row. The pipeline marks the ledger "not
private" when it creates it, so ``ledger show``, ``metrics.json`` and ``release/MANIFEST.json`` say
so; the stages below also mark their own stage with what they switched off, and record no event
(no finite epsilon exists to record).

* features: the real attribute rows resampled with replacement (:func:`noiseless_features`). AIM
  cannot run with zero noise (its budget is a finite rho); with rho -> inf its model reproduces
  the measured marginals exactly, and the data's own joint distribution is that limit's best case.
* generator: the same LoRA fine-tuning as DP-SGD (same engine, Poisson batches, optimizer and
  steps) with sigma = 0 and no per-example clipping (:func:`train_noiseless_lora`).

Direct prompting (``generator_mode: direct_prompt``): the base model, never trained, is prompted
with the DP attribute rows, so the private records reach no generator and eps2 is not spent; the
ledger gets a zero-cost entry that says so (:func:`record_direct_prompting`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

NO_NOISE_FEATURES = "features: real attribute rows resampled, no AIM noise (epsilon = inf reference run)"
NO_NOISE_GENERATOR = "LoRA fine-tuning without noise (sigma = 0) or clipping (epsilon = inf reference run)"


def noiseless_features(real: pd.DataFrame, schema, n_rows: int, seed: int, ledger, out_path: Path
                       ) -> tuple[pd.DataFrame, dict]:
    """``n_rows`` rows drawn with replacement from the real attribute table (config seed: there
    is no privacy to protect in a reference run); the ledger's "features" stage is marked."""
    from dpsynth_core.actg.features import write_csv_atomic

    ledger.mark_not_private("features", NO_NOISE_FEATURES)
    rng = np.random.default_rng(seed)
    synth = real[schema.field_names].iloc[rng.integers(0, len(real), size=n_rows)].reset_index(drop=True)
    schema.validate_table(synth, source="resampled attributes")
    write_csv_atomic(synth, out_path)
    return synth, {"mechanism": "resampled real rows (no noise)", "noise": 0.0}


def no_clipping(model, max_grad_norm: float):
    """A clipper for ``DpSgdEngine`` that sums the batch gradient with one ordinary backward."""
    from dpsynth_core.dpsgd.clipping import BatchGradientSum

    return BatchGradientSum(model, max_grad_norm)


def train_noiseless_lora(examples, config, *, output_dir: Path, ledger, stage: str, progress: bool = False):
    """The DP-SGD engine's LoRA training with sigma = 0 and no clipping; marks ``stage`` not private.

    Writes ``output_dir/adapter`` (peft adapter + dp_training.json with noise_multiplier 0) and
    returns a ``TrainResult`` (epsilon inf)."""
    import torch

    from dpsynth_core.dpsgd.budget import sampling_rate
    from dpsynth_core.dpsgd.config import TrainResult
    from dpsynth_core.dpsgd.engine import DpSgdEngine
    from dpsynth_core.dpsgd.plots import save_training_curve
    from dpsynth_core.dpsgd.trainer import ADAPTER_DIRNAME, CURVE_FILENAME, SUMMARY_FILENAME
    from dpsynth_core.privacy.randomness import secret_seed
    from dpsynth_core.runs.files import atomic_dir

    ledger.mark_not_private(stage, NO_NOISE_GENERATOR)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    engine = DpSgdEngine(examples, config, noise_multiplier=0.0, sampling_seed=secret_seed(62),
                         clipper_factory=no_clipping)
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


def record_direct_prompting(cfg, ledger) -> dict:
    """The "direct prompting" ablation's generator: the base model, untrained; a zero-cost ledger
    entry states that eps2 was not spent (the features stage is the only charge)."""
    from dpsynth_core.privacy import PostProcessingEvent

    details = {"generator": "base model prompted with the DP attribute rows (not trained on private data)",
               "model": cfg.dpsgd_config(1.0).model, "epsilon": 0.0}
    if not any(e.stage == "dp_generator" for e in ledger.entries()):
        ledger.record("dp_generator", PostProcessingEvent(), details=details)
    return {"adapter_dir": None, "mode": "direct_prompt", "epsilon": 0.0, **details}
