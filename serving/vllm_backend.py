"""vLLM backend (GPU). Chosen with ``backend: vllm`` in the model config.

vLLM batches continuously inside its engine, so the Generator deployment submits rows straight to
it instead of going through ``@serve.batch``. NOTE: written against vLLM's AsyncLLMEngine API but
never run here (the development machine has no GPU and vLLM is not installed); treat as untested.
"""

from __future__ import annotations

import uuid

from serving.schemas import RequestLimitError, SequenceJob, SequenceOutput, truncate_at_stop


class VLLMBackend:
    def __init__(self, model: str, adapter: str | None = None, *, dtype: str = "float32",
                 max_prompt_tokens: int = 2048, engine_kwargs: dict | None = None) -> None:
        try:
            from vllm import AsyncEngineArgs, AsyncLLMEngine
        except ImportError:
            from dpsynth_core.errors import ConfigError

            raise ConfigError("backend 'vllm' needs the vllm package (pip install '.[gpu]' on a GPU node)") from None
        from dpsynth_core.models import load_tokenizer, resolve_model_dir

        kwargs = {"dtype": "auto" if dtype == "float32" else dtype, **(engine_kwargs or {})}
        if adapter is not None:
            kwargs.setdefault("enable_lora", True)
        args = AsyncEngineArgs(model=str(resolve_model_dir(model)), **kwargs)
        self.engine = AsyncLLMEngine.from_engine_args(args)
        self.tokenizer = load_tokenizer(model)
        self.max_prompt_tokens = max_prompt_tokens
        self.lora = None
        if adapter is not None:
            from vllm.lora.request import LoRARequest

            self.lora = LoRARequest("adapter", 1, str(adapter))

    def render_chat(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    async def generate_one(self, job: SequenceJob) -> SequenceOutput:
        from vllm import SamplingParams

        ids = self.tokenizer(job.prompt, add_special_tokens=job.add_special_tokens)["input_ids"]
        if len(ids) > self.max_prompt_tokens:
            raise RequestLimitError(f"'prompt': {len(ids)} tokens exceed the limit of {self.max_prompt_tokens}")
        params = SamplingParams(
            n=1, temperature=job.temperature, top_p=job.top_p, max_tokens=job.max_new_tokens,
            seed=job.seed % (2**31), stop=job.stop or None,
        )
        final = None
        async for output in self.engine.generate(
            {"prompt_token_ids": ids}, params, request_id=uuid.uuid4().hex, lora_request=self.lora
        ):
            final = output
        completion = final.outputs[0]
        text, cut = truncate_at_stop(completion.text, job.stop)
        reason = "stop" if cut or completion.finish_reason == "stop" else "length"
        return SequenceOutput(text, len(ids), len(completion.token_ids), reason)
