"""LoRA target modules checked against the model's module names: at planning time on the meta device
(no weights loaded, so a typo fails before any data is read) and when the engine builds the model.

Below both ``budget`` (the privacy plan checks the config) and ``engine`` (which builds the model).
"""

from __future__ import annotations

from torch import nn

from dpsynth_core.dpsgd.config import DpSgdConfig, LoraSettings
from dpsynth_core.errors import ConfigError


def module_leaf_names(model: nn.Module) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, _ in model.named_modules() if name}


def check_target_modules(model: nn.Module, lora: LoraSettings, model_name: str) -> None:
    """ConfigError naming the unknown LoRA target modules and the linear layers that do exist."""
    names = module_leaf_names(model)
    unknown = [t for t in lora.target_modules if t not in names]
    if unknown:
        linear = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
        raise ConfigError(
            f"field 'lora.target_modules': {unknown} not found in model '{model_name}'; "
            f"its linear layers are {linear}"
        )


def validate_target_modules(config: DpSgdConfig) -> None:
    """Check LoRA target modules against the model's module names without loading weights
    (the model is built on the meta device), so a typo fails before any data is read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from dpsynth_core.models import resolve_model_dir

    hf_config = AutoConfig.from_pretrained(resolve_model_dir(config.model))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config)
    check_target_modules(model, config.lora, config.model)
