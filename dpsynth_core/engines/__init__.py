"""One text-generation interface, two backends: vLLM (where installed and it supports the model) and HF.

    engine = load_engine(EngineConfig(model="smollm2-135m-instruct", adapter_dir=run / "adapter"))
    texts = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=64, stop=["\\n\\n"]))

Generation samples from a released (DP) or public model: post-processing. No Ray here.
"""

from dpsynth_core.engines.base import GenerationBatch, TextEngine, cut_at_stop
from dpsynth_core.engines.config import EngineConfig, SamplingParams
from dpsynth_core.engines.factory import load_engine, resolve_backend, vllm_installed, vllm_unsupported_reason

__all__ = [
    "EngineConfig",
    "GenerationBatch",
    "SamplingParams",
    "TextEngine",
    "cut_at_stop",
    "load_engine",
    "resolve_backend",
    "vllm_installed",
    "vllm_unsupported_reason",
]
