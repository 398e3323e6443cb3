"""What an ``adapter_dir`` is: a peft LoRA adapter (the DP-SGD output) or an already merged model."""

from __future__ import annotations

import json
from pathlib import Path

from dpsynth_core.errors import ConfigError


def adapter_kind(adapter_dir: Path) -> str:
    """``"lora"`` (adapter_config.json) or ``"merged"`` (a full model directory)."""
    adapter_dir = Path(adapter_dir)
    if not adapter_dir.is_dir():
        raise ConfigError(f"{adapter_dir}: adapter directory not found")
    if (adapter_dir / "adapter_config.json").is_file():
        return "lora"
    if (adapter_dir / "config.json").is_file():
        return "merged"
    raise ConfigError(f"{adapter_dir}: neither a LoRA adapter (adapter_config.json) nor a model (config.json)")


def lora_rank(adapter_dir: Path) -> int:
    """The adapter's rank ``r`` (vLLM sizes its LoRA buffers from the largest rank it will see)."""
    config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text(encoding="utf-8"))
    return int(config.get("r", 8))


def load_hf_model(model: str, adapter_dir: Path | None, placement):
    """(model, tokenizer) in eval mode on ``placement`` (``config.placement.Placement``): the base, the base
    with the LoRA adapter, or a merged model."""
    from dpsynth_core.config.placement import place_model
    from dpsynth_core.models import load_causal_lm, load_tokenizer

    if adapter_dir is None:
        return load_causal_lm(model, placement=placement)
    if adapter_kind(adapter_dir) == "merged":
        return load_causal_lm(str(adapter_dir), placement=placement)
    from peft import PeftModel

    base, _ = load_causal_lm(model, placement=placement)
    peft_model = PeftModel.from_pretrained(base, str(adapter_dir))
    place_model(peft_model, placement)  # the adapter's weights join the base's device
    peft_model.eval()
    return peft_model, load_tokenizer(model)


def merge_adapter(model: str, adapter_dir: Path, out: Path) -> Path:
    """Base + LoRA merged into one plain HF directory (float32, with tokenizer) at ``out``."""
    from dpsynth_core.config.placement import Placement
    from dpsynth_core.runs.files import atomic_dir

    def build(staging: Path) -> None:
        # merged on CPU in fp32: a one-off copy that vLLM then loads in its own dtype
        peft_model, tokenizer = load_hf_model(model, adapter_dir, Placement("cpu", "fp32"))
        merged = peft_model.merge_and_unload()
        merged.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))

    if not (out / "config.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_dir(out, build)
    return out
