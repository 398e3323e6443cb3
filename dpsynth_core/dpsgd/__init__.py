"""DP-SGD LoRA fine-tuning: per-sample clipping (opacus hooks / ghost), Poisson sampling that
matches the accountant, noise calibrated to the stage's epsilon, ledger accounting, resume.

    result = train_dp_lora(examples, DpSgdConfig(epsilon=4, steps=200, ...), output_dir=..., ledger=ledger)
    model, tokenizer = load_generator(config.model, result.adapter_dir)
"""

from dpsynth_core.dpsgd.config import DpSgdConfig, LoraSettings, TrainExample, TrainResult
from dpsynth_core.dpsgd.trainer import load_generator, train_dp_lora

__all__ = ["DpSgdConfig", "LoraSettings", "TrainExample", "TrainResult", "load_generator", "train_dp_lora"]
