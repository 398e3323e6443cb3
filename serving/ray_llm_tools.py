"""Best-of-N and multi-PLM on top of Ray's LLM app (``ServeConfig.app: ray_llm``).

Ray's OpenAI app (serving.ray_llm) serves ``/v1/*`` from one ``LLMServer`` deployment per model.
This second Serve app, ``<app_name>-tools`` (no HTTP route), puts our :class:`BestOfN` and
:class:`MultiPLMRouter` deployments over those same ``LLMServer`` replicas through a thin
:class:`RayLLMGenerator` adapter, so :func:`serving.app.deploy` returns the same Python handle
(``generate``, ``generate_detailed``, ``best_of_n``, ``generate_multi``, ``models``, ``stats``) for
both apps, and the candidates of Best-of-N are decoded by Ray's engines with their continuous batching.
"""

from __future__ import annotations

import asyncio

from ray import serve

from serving.config import LimitsConfig, ServeConfig
from serving.deployments import BestOfN, MultiPLMRouter, as_request
from serving.schemas import (
    GenerationRequest,
    GenerationResult,
    RequestLimitError,
    SequenceJob,
    SequenceOutput,
    check_limits,
    expand_jobs,
)


def tools_app_name(app_name: str) -> str:
    """The Best-of-N / multi-PLM app that goes with Ray's LLM app ``app_name``."""
    return f"{app_name}-tools"


def llm_server_name(model_id: str) -> str:
    """The deployment name ``ray.serve.llm.build_openai_app`` gives a model's LLMServer."""
    return "LLMServer:" + model_id.replace("/", "--").replace(".", "_")


@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0})
class RayLLMGenerator:
    """Our generator interface over one of Ray's ``LLMServer`` deployments: one OpenAI completion
    request per row (prompt x sample), each with its row seed; vLLM batches them continuously."""

    def __init__(self, llm_app: str, model_id: str, limits: dict) -> None:
        self.model_id = model_id
        self.limits = LimitsConfig.model_validate(limits)
        # LLMServer.completions is an async generator: its handle must stream
        self.server = serve.get_deployment_handle(llm_server_name(model_id), app_name=llm_app).options(stream=True)
        self._requests = 0
        self._tokens_generated = 0

    async def generate(self, request: GenerationRequest) -> list[list[str]]:
        return (await self.generate_detailed(request)).texts()

    async def generate_detailed(self, request: GenerationRequest) -> GenerationResult:
        request = as_request(request, GenerationRequest)
        check_limits(self.limits, prompts=request.prompts, max_new_tokens=request.max_new_tokens, n=request.n)
        outputs = await asyncio.gather(*(self._one(job) for job in expand_jobs(request)))
        n = request.n
        return GenerationResult([list(outputs[i * n:(i + 1) * n]) for i in range(len(request.prompts))])

    async def _one(self, job: SequenceJob) -> SequenceOutput:
        from ray.serve.llm.openai_api_models import CompletionRequest

        body = CompletionRequest(model=self.model_id, prompt=job.prompt, max_tokens=job.max_new_tokens,
                                 temperature=job.temperature, top_p=job.top_p, seed=job.seed, stop=job.stop or None,
                                 add_special_tokens=job.add_special_tokens, stream=False)
        response = None
        async for item in self.server.completions.remote(body, None):
            response = item
        choices = getattr(response, "choices", None)
        if not choices:  # an ErrorResponse: vLLM refused the request (its message names no prompt text)
            message = getattr(getattr(response, "error", None), "message", None) or "no completion returned"
            raise RequestLimitError(f"model '{self.model_id}': {message}")
        usage = response.usage
        self._requests += 1
        self._tokens_generated += usage.completion_tokens
        return SequenceOutput(text=choices[0].text, prompt_tokens=usage.prompt_tokens,
                              completion_tokens=usage.completion_tokens,
                              finish_reason="length" if choices[0].finish_reason == "length" else "stop")

    async def ping(self) -> dict:
        return {"model": self.model_id}

    def stats(self) -> dict:
        """Counts only (Ray's engine does the batching; its metrics are Ray's)."""
        return {"model": self.model_id, "requests": self._requests, "tokens_generated": self._tokens_generated}


def build_ray_llm_tools_app(config: ServeConfig):
    """Our ingress (Python handle API; no HTTP route) with Best-of-N and multi-PLM over Ray's engines."""
    from serving.openai_api import OpenAIIngress

    limits = config.limits.model_dump()
    generators = {m.name: RayLLMGenerator.options(name=f"RayLLMGenerator:{m.name}").bind(config.app_name, m.name, limits)
                  for m in config.models}
    best = BestOfN.bind(generators, config.best_of_n.model_dump(), limits, {m.name: m.capacity() for m in config.models})
    router = MultiPLMRouter.bind(generators)
    return OpenAIIngress.bind(generators, best, router, config.model_dump(), None)
