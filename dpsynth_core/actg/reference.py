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
  steps) with sigma = 0 and no per-example clipping (``dpsgd.noiseless.train_noiseless_lora``).

Direct prompting (``generator_mode: direct_prompt``): the base model, never trained, is prompted
with the DP attribute rows, so the private records reach no generator and eps2 is not spent; the
ledger gets a zero-cost entry that says so (:func:`record_direct_prompting`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["NO_NOISE_FEATURES", "noiseless_features", "record_direct_prompting"]

NO_NOISE_FEATURES = "features: real attribute rows resampled, no AIM noise (epsilon = inf reference run)"


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


def record_direct_prompting(cfg, ledger) -> dict:
    """The "direct prompting" ablation's generator: the base model, untrained; a zero-cost ledger
    entry states that eps2 was not spent (the features stage is the only charge)."""
    from dpsynth_core.privacy import PostProcessingEvent

    details = {"generator": "base model prompted with the DP attribute rows (not trained on private data)",
               "model": cfg.dpsgd_config(1.0).model, "epsilon": 0.0}
    if not any(e.stage == "dp_generator" for e in ledger.entries()):
        ledger.record("dp_generator", PostProcessingEvent(), details=details)
    return {"adapter_dir": None, "mode": "direct_prompt", "epsilon": 0.0, **details}
