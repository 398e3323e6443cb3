"""One text-generation interface, two backends: vLLM (where installed and it supports the model) and HF.

    engine = load_engine(EngineConfig(model="smollm2-135m-instruct", adapter_dir=run / "adapter"))
    texts = engine.generate(prompts, SamplingParams(n=4, max_new_tokens=64, stop=["\\n\\n"]))

Generation samples from a released (DP) or public model: post-processing. No Ray here.

The only way the library and Serve generate (tests/test_engines.py checks that no other module calls a
model's ``generate``), with one parameter type, :class:`SamplingParams`. The HF backend also serves the
callers that need the model itself: ``HFEngine.from_loaded`` (a model in memory, e.g. in training),
``generate_processed`` (a logits processor: constrained rows) and ``decode_rows`` (rows with their own
parameters in one batch: Serve's HF replicas).
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
