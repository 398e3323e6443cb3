"""Ray-backed LLMs for WASP / Aug-PE: every PLM runs in its own Ray actor or Serve deployment, so
``submit`` returns at once and K PLMs generate concurrently (``dpsynth_core`` stays Ray-free).

    llms = make_llms(cfg.plms)      # picks the backend named by each PLMConfig.backend
"""

from __future__ import annotations

from collections.abc import Sequence

import ray

from dpsynth_core.errors import ConfigError
from dpsynth_core.pe.config import PLMConfig
from dpsynth_core.pe.llm import LLM, GenerationParams, HFLocalLLM, OpenAICompatibleLLM, clean_completion, format_prompt

_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@ray.remote
class PLMActor:
    """Holds one :class:`HFLocalLLM` in a Ray worker process."""

    def __init__(self, model: str, batch_size: int, num_threads: int) -> None:
        self.llm = HFLocalLLM(model, batch_size=batch_size, num_threads=num_threads)

    def generate(self, prompts: list[str], params: GenerationParams) -> list[str]:
        return self.llm.generate(prompts, params)

    def ready(self) -> bool:
        return True


class _RefResult:
    def __init__(self, ref) -> None:
        self.ref = ref

    def result(self) -> list[str]:
        return ray.get(self.ref)


class RayActorLLM(LLM):
    """A PLM in a dedicated Ray actor (``num_cpus`` = its torch threads)."""

    def __init__(self, cfg: PLMConfig) -> None:
        self.name = cfg.display_name
        self.actor = PLMActor.options(num_cpus=cfg.num_threads, runtime_env={"env_vars": _ENV}).remote(
            cfg.model, cfg.batch_size, cfg.num_threads
        )

    def wait_ready(self) -> None:
        ray.get(self.actor.ready.remote())

    def submit(self, prompts: list[str], params: GenerationParams):
        return _RefResult(self.actor.generate.remote(prompts, params))

    def generate(self, prompts: list[str], params: GenerationParams) -> list[str]:
        return self.submit(prompts, params).result()

    def close(self) -> None:
        ray.kill(self.actor)


class ServeHandleLLM(LLM):
    """A PLM behind a Ray Serve ``Generator`` deployment (serving engineer's contract):
    ``handle.generate.remote(GenerationRequest(...)) -> list[list[str]]``. Prompts are rendered with
    the model's chat template here and sent with ``chat=True``."""

    def __init__(self, handle, model: str, name: str | None = None) -> None:
        from dpsynth_core.models import load_tokenizer

        self.handle = handle
        self.name = name or model
        self.tokenizer = load_tokenizer(model)

    def submit(self, prompts: list[str], params: GenerationParams):
        from serving.schemas import GenerationRequest

        req = GenerationRequest(prompts=[format_prompt(self.tokenizer, p) for p in prompts],
                                max_new_tokens=params.max_new_tokens, temperature=params.temperature,
                                top_p=params.top_p, n=1, seed=params.seed, chat=True)
        response = self.handle.generate.remote(req)  # DeploymentResponse: does not block

        class _Resp:
            def result(_self) -> list[str]:
                return [clean_completion(c[0]) for c in response.result()]

        return _Resp()

    def generate(self, prompts: list[str], params: GenerationParams) -> list[str]:
        return self.submit(prompts, params).result()


def deploy_serve_plm(cfg: PLMConfig, app_name: str):
    """Deploy one Generator for ``cfg.model`` as its own Serve application; returns its handle."""
    from ray import serve

    from serving.app import build_generation_app

    app = build_generation_app({"model": cfg.model, "num_cpus": cfg.num_threads, "max_batch_size": cfg.batch_size})
    return serve.run(app, name=app_name, route_prefix=f"/{app_name}")


def make_llms(plms: Sequence[PLMConfig]) -> list[LLM]:
    """One backend per configured PLM; actors are started together and awaited once."""
    if any(p.backend in ("ray_actor", "serve") for p in plms) and not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, runtime_env={"env_vars": _ENV})
    out: list[LLM] = []
    for k, p in enumerate(plms):
        if p.backend == "hf":
            out.append(HFLocalLLM(p.model, batch_size=p.batch_size, num_threads=p.num_threads, name=p.display_name))
        elif p.backend == "ray_actor":
            out.append(RayActorLLM(p))
        elif p.backend == "serve":
            out.append(ServeHandleLLM(deploy_serve_plm(p, f"pe-plm-{k}"), p.model, p.display_name))
        elif p.backend == "openai":
            if not p.base_url:
                raise ConfigError(f"plms[{k}].base_url is required for backend 'openai'")
            out.append(OpenAICompatibleLLM(p.base_url, p.model, api_key_env=p.api_key_env, name=p.display_name))
        else:  # pragma: no cover - pydantic restricts the values
            raise ConfigError(f"plms[{k}].backend: unknown backend '{p.backend}'")
    for llm in out:
        if isinstance(llm, RayActorLLM):
            llm.wait_ready()
    return out
