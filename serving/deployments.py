"""Ray Serve deployments: ``Generator`` (batched replicas), ``BestOfN`` and ``MultiPLMRouter``.

Python handle API (the contract other pipelines code against)::

    rows = await generator_handle.generate.remote(GenerationRequest(prompts=[...], n=2))   # list[list[str]]
    best = await best_of_n_handle.best_of_n.remote(BestOfNRequest(prompts=[...], n=8, metadata=[...]))
    tagged = await router_handle.generate.remote(GenerationRequest(...))   # {plm_name: list[list[str]]}

No prompt or completion is ever logged: requests may carry private text.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter, deque

from ray import serve

from serving.config import BestOfNSettings, LimitsConfig, ModelDeploymentConfig
from serving.schemas import (
    BestOfNRequest,
    BestOfNResult,
    GenerationRequest,
    GenerationResult,
    RequestLimitError,
    SequenceJob,
    SequenceOutput,
    UnknownModelError,
    check_limits,
    expand_jobs,
    row_seed,
)


def as_request(request, cls):
    """Handles may receive a model instance or a plain dict (e.g. from other languages / JSON)."""
    return request if isinstance(request, cls) else cls.model_validate(request)


@serve.deployment(max_ongoing_requests=64, ray_actor_options={"num_cpus": 1})
class Generator:
    """One model (+ optional LoRA adapter) per replica; rows from concurrent requests share batches."""

    def __init__(self, settings: dict, limits: dict) -> None:
        self.settings = ModelDeploymentConfig.model_validate(settings)
        self.limits = LimitsConfig.model_validate(limits)
        s = self.settings
        from dpsynth_core.engines import EngineConfig, resolve_backend

        # "vllm" or "hf"; a replica forced onto a device it cannot see fails here, before serving
        self.engine = resolve_backend(EngineConfig(model=s.model, backend=s.backend, device=s.device))
        if self.engine == "vllm":
            from serving.vllm_backend import VLLMBackend

            self.backend = VLLMBackend(s.model, s.adapter, dtype=s.dtype, max_prompt_tokens=self.limits.max_prompt_tokens,
                                       engine_kwargs=s.vllm_engine_kwargs, merge_adapter=s.merge_adapter,
                                       kv_cache_gib=s.kv_cache_gib)
        else:
            from serving.hf_backend import HFBackend

            self.backend = HFBackend(s.model, s.adapter, dtype=s.dtype, device=s.device, torch_threads=s.torch_threads,
                                     merge_adapter=s.merge_adapter, max_prompt_tokens=self.limits.max_prompt_tokens)
            self._run_batch.set_max_batch_size(s.max_batch_size)
            self._run_batch.set_batch_wait_timeout_s(s.batch_wait_timeout_s)
        self._batch_sizes: deque[int] = deque(maxlen=10_000)
        self._batch_histogram: Counter[int] = Counter()
        self._tokens_generated = 0
        self._busy_s = 0.0
        self._pending_rows = 0  # rows accepted and not finished (queued in a batch or decoding)
        self._metric = None
        try:  # exported to Prometheus through Ray's metrics agent when one runs
            from ray.serve.metrics import Histogram

            self._metric = Histogram("dpsynth_generator_batch_size", description="rows per forward batch",
                                     boundaries=[1, 2, 4, 8, 16, 32, 64, 128])
        except Exception:
            self._metric = None

    async def generate(self, request: GenerationRequest) -> list[list[str]]:
        """``n`` completions per prompt, prompt order preserved."""
        return (await self.generate_detailed(request)).texts()

    async def generate_detailed(self, request: GenerationRequest) -> GenerationResult:
        """Like :meth:`generate`, with token counts and finish reasons (for the OpenAI routes)."""
        request = as_request(request, GenerationRequest)
        check_limits(self.limits, prompts=request.prompts, max_new_tokens=request.max_new_tokens, n=request.n)
        cancelled = threading.Event()
        self._pending_rows += len(request.prompts) * request.n
        try:
            outputs = await asyncio.gather(*(self._submit(job) for job in expand_jobs(request, cancelled)))
        except asyncio.CancelledError:  # the caller timed out or went away: stop decoding its rows
            cancelled.set()
            raise
        finally:
            self._pending_rows -= len(request.prompts) * request.n
        n = request.n
        return GenerationResult([list(outputs[i * n:(i + 1) * n]) for i in range(len(request.prompts))])

    async def _submit(self, job: SequenceJob) -> SequenceOutput:
        if self.engine == "vllm":
            return await self.backend.generate_one(job)
        return await self._run_batch(job)

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.05)
    async def _run_batch(self, jobs: list[SequenceJob]) -> list[SequenceOutput]:
        self._record_batch(len(jobs))
        start = time.perf_counter()
        # A worker thread keeps the event loop free to queue the next batch while this one decodes.
        outputs = await asyncio.to_thread(self.backend.generate, jobs)
        self._busy_s += time.perf_counter() - start
        self._tokens_generated += sum(o.completion_tokens for o in outputs)
        return outputs

    def _record_batch(self, size: int) -> None:
        self._batch_sizes.append(size)
        self._batch_histogram[size] += 1
        if self._metric is not None:
            self._metric.observe(size)

    async def render_chat(self, messages: list[dict]) -> str:
        """The model's chat template applied to ``messages`` (with the assistant generation prompt)."""
        return self.backend.render_chat(messages)

    def stats(self) -> dict:
        """This replica's batching statistics (sizes only, never content)."""
        sizes = list(self._batch_sizes)
        return {
            "model": self.settings.name,
            "batches": len(sizes),
            "max_batch_size_seen": max(sizes, default=0),
            "mean_batch_size": (sum(sizes) / len(sizes)) if sizes else 0.0,
            "batch_size_histogram": dict(sorted(self._batch_histogram.items())),
            "tokens_generated": self._tokens_generated,
            "busy_seconds": round(self._busy_s, 3),
        }

    async def ping(self) -> dict:
        """Answered by the replica's event loop (decoding runs in a thread); the readiness probe's target."""
        return {"model": self.settings.name, "pending_rows": self._pending_rows}

    def info(self) -> dict:
        s = self.settings
        return {"name": s.name, "model": s.model, "adapter": s.adapter, "backend": self.engine}


@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0})
class BestOfN:
    """Fans N candidates per prompt out to a generator's replicas and keeps the best-scoring one."""

    def __init__(self, generators: dict, settings: dict, limits: dict, capacities: dict | None = None) -> None:
        from serving.scorers import load_scorer

        self.generators = generators  # name -> DeploymentHandle
        # At most a generator's capacity of candidate calls in flight from here: a large N x prompts
        # waits its turn instead of overflowing the generator's queue (which would refuse it).
        self._slots = {name: asyncio.Semaphore(cap) for name, cap in (capacities or {}).items()}
        self.default_model = next(iter(generators))
        self.settings = BestOfNSettings.model_validate(settings)
        self.limits = LimitsConfig.model_validate(limits)
        self._load_scorer = load_scorer
        self._scorers = {self.settings.scorer: load_scorer(self.settings.scorer)}

    def _scorer(self, path: str | None):
        path = path or self.settings.scorer
        if path not in self._scorers:
            if path not in self.settings.allowed_scorers:
                raise RequestLimitError(f"'scorer': '{path}' is not in best_of_n.allowed_scorers")
            self._scorers[path] = self._load_scorer(path)
        return self._scorers[path]

    async def best_of_n(self, request: BestOfNRequest) -> list[BestOfNResult]:
        """One :class:`BestOfNResult` per prompt: best candidate, its index and score, all scores."""
        request = as_request(request, BestOfNRequest)
        check_limits(self.limits, prompts=request.prompts, max_new_tokens=request.max_new_tokens, n=request.n)
        if request.metadata is not None and len(request.metadata) != len(request.prompts):
            raise RequestLimitError(
                f"'metadata': {len(request.metadata)} entries for {len(request.prompts)} prompts (need one per prompt)"
            )
        model = request.model or self.default_model
        if model not in self.generators:
            raise UnknownModelError(f"'model': unknown model '{model}'; served: {', '.join(self.generators)}")
        scorer = self._scorer(request.scorer)
        handle = self.generators[model]
        slots = self._slots.get(model)

        async def candidate(i: int, prompt: str, j: int) -> str:
            # One single-row call per candidate, so Serve's router spreads them over all replicas
            # (and each replica's @serve.batch merges what lands on it).
            call = GenerationRequest(
                prompts=[prompt], n=1, max_new_tokens=request.max_new_tokens, temperature=request.temperature,
                top_p=request.top_p, seed=None if request.seed is None else row_seed(request.seed, i, j),
            )
            if slots is None:
                return (await handle.generate.remote(call))[0][0]
            async with slots:
                return (await handle.generate.remote(call))[0][0]

        flat = list(await asyncio.gather(*(
            candidate(i, prompt, j) for i, prompt in enumerate(request.prompts) for j in range(request.n)
        )))
        metadata = request.metadata or [{} for _ in request.prompts]
        return await asyncio.to_thread(self._score, request.prompts, flat, metadata, request.n, scorer)

    @staticmethod
    def _score(prompts, flat, metadata, n, scorer) -> list[BestOfNResult]:
        results = []
        for i, prompt in enumerate(prompts):
            candidates = flat[i * n:(i + 1) * n]
            scores = []
            for candidate in candidates:
                value = float(scorer(prompt, candidate, metadata[i]))
                scores.append(value if math.isfinite(value) else -math.inf)  # NaN never wins
            best = max(range(n), key=lambda k: (scores[k], -k))  # ties: the earliest candidate
            results.append(BestOfNResult(best=candidates[best], best_index=best, best_score=scores[best],
                                         candidates=candidates, scores=scores))
        return results


@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0})
class MultiPLMRouter:
    """Sends one request to K generator deployments concurrently; results tagged by PLM name."""

    def __init__(self, generators: dict) -> None:
        self.generators = generators  # name -> DeploymentHandle, in config order

    async def generate(self, request: GenerationRequest, plms: list[str] | None = None) -> dict[str, list[list[str]]]:
        """``{plm_name: n completions per prompt}`` for every requested PLM (default: all)."""
        request = as_request(request, GenerationRequest)
        names = list(plms) if plms else list(self.generators)
        unknown = [p for p in names if p not in self.generators]
        if unknown:
            raise UnknownModelError(f"'plms': unknown {', '.join(unknown)}; served: {', '.join(self.generators)}")
        results = await asyncio.gather(*(self.generators[p].generate.remote(request) for p in names))
        return dict(zip(names, results))

    def plms(self) -> list[str]:
        return list(self.generators)
