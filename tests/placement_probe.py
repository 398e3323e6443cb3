"""Shared by tests/test_placement_*.py: pretend a GPU is visible and catch the placement a stage
hands to the model loader, without moving anything to CUDA (this machine has none)."""

from __future__ import annotations

from pathlib import Path

import pytest


class LoaderReached(Exception):
    """Raised by the stub loader: carries the placement the stage asked for."""

    def __init__(self, name: str, placement) -> None:
        super().__init__(f"load_causal_lm({name!r}, placement={placement})")
        self.name = name
        self.placement = placement


@pytest.fixture
def fake_gpu(monkeypatch):
    """``devices.gpu_visible()`` says yes; ``load_causal_lm`` stops the stage with LoaderReached."""
    import dpsynth_core.config.placement as devices
    import dpsynth_core.models as models

    monkeypatch.setattr(devices, "gpu_visible", lambda: True)

    def stub(name, *, dtype=None, placement=None):
        raise LoaderReached(name, placement)

    monkeypatch.setattr(models, "load_causal_lm", stub)


def asked_for_gpu_bf16(err: LoaderReached) -> bool:
    p = err.placement
    return p is not None and (p.device, p.dtype) == ("cuda", "bf16")


def save_tiny_adapter(out: Path) -> Path:
    """A LoRA adapter for tiny-llama (what DP-SGD writes), built in a second."""
    from peft import LoraConfig, get_peft_model

    from dpsynth_core.models import load_causal_lm

    base, _ = load_causal_lm("tiny-llama")
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    peft_model.save_pretrained(str(out))
    return out
