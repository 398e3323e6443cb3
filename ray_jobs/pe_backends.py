"""Ray-backed LLMs for WASP / Aug-PE: every PLM runs in its own Ray actor or Serve deployment, so
``submit`` returns at once and K PLMs generate concurrently (``dpsynth_core`` stays Ray-free).

    llms = make_llms(cfg.plms)      # picks the backend named by each PLMConfig.backend
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import ray

from dpsynth_core.config.resources import StageResources
from dpsynth_core.errors import ConfigError
from dpsynth_core.pe.config import PLMConfig
from dpsynth_core.engines.config import SamplingParams
from dpsynth_core.pe.llm import LLM, LocalLLM, OpenAICompatibleLLM, clean_completion, format_prompt
from ray_jobs.cluster import OFFLINE_ENV, ensure_ray, stage_options


@ray.remote
class PLMActor:
    """Holds one :class:`LocalLLM` (vLLM or HF engine) in a Ray worker process."""

    def __init__(self, model: str, batch_size: int, num_threads: int, engine: str = "auto",
                 device: str = "auto", dtype: str = "auto") -> None:
        self.llm = LocalLLM(model, batch_size=batch_size, num_threads=num_threads, engine=engine,
                            device=device, dtype=dtype)

    def generate(self, prompts: list[str], params: SamplingParams) -> list[str]:
        return self.llm.generate(prompts, params)

    def ready(self) -> bool:
        return True

    def where(self) -> dict:
        """The node and GPU ids this PLM runs on (recorded in the run's ``ran_on.json``)."""
        from ray_jobs.cluster import where_am_i

        return where_am_i()


class _RefResult:
    def __init__(self, ref) -> None:
        self.ref = ref

    def result(self) -> list[str]:
        return ray.get(self.ref)


def plm_resources(cfg: PLMConfig) -> StageResources:
    """The PLM's Ray request: ``resources`` when given (a GPU PLM says ``gpus: 1``), else its torch threads' CPUs."""
    gpus = 1 if cfg.device == "cuda" else 0  # device: cuda must see one (Ray hides GPUs otherwise)
    return (cfg.resources or StageResources()).over(StageResources(cpus=cfg.num_threads, gpus=gpus))


class RayActorLLM(LLM):
    """A PLM in a dedicated Ray actor, sized by :func:`plm_resources`."""

    def __init__(self, cfg: PLMConfig) -> None:
        self.name = cfg.display_name
        opts = stage_options(plm_resources(cfg), f"PLM {cfg.display_name}")
        self.actor = PLMActor.options(**opts, runtime_env={"env_vars": OFFLINE_ENV}).remote(
            cfg.model, cfg.batch_size, cfg.num_threads, cfg.engine, cfg.device, cfg.dtype
        )

    def wait_ready(self) -> None:
        ray.get(self.actor.ready.remote())

    def submit(self, prompts: list[str], params: SamplingParams):
        return _RefResult(self.actor.generate.remote(prompts, params))

    def generate(self, prompts: list[str], params: SamplingParams) -> list[str]:
        return self.submit(prompts, params).result()

    def where(self) -> dict:
        return ray.get(self.actor.where.remote())

    def close(self) -> None:
        ray.kill(self.actor)


class ServeHandleLLM(LLM):
    """A PLM behind its own Ray Serve ``Generator`` deployment, reached through the generation app's
    ingress handle (``handle.generate.remote(GenerationRequest, model) -> list[list[str]]``, the
    serving contract). ``submit`` returns a ``DeploymentResponse`` at once, so the K PLMs' requests
    run concurrently, each batched by its replica. Prompts are chat-rendered here (``chat=True``)."""

    def __init__(self, handle, deployment_name: str, model: str, name: str | None = None,
                 max_prompts: int = 64, app_name: str = "dpsynth-pe-plms") -> None:
        from dpsynth_core.models import load_tokenizer

        self.handle = handle
        self.deployment_name = deployment_name
        self.name = name or model
        self.max_prompts = max_prompts
        self.app_name = app_name
        self.tokenizer = load_tokenizer(model)

    def submit(self, prompts: list[str], params: SamplingParams):
        from serving.schemas import GenerationRequest

        rendered = [format_prompt(self.tokenizer, p) for p in prompts]
        chat = bool(getattr(self.tokenizer, "chat_template", None))  # template already added the specials
        responses = [
            self.handle.generate.remote(GenerationRequest(
                prompts=rendered[i : i + self.max_prompts], max_new_tokens=params.max_new_tokens,
                temperature=params.temperature, top_p=params.top_p, n=1, seed=None if params.seed is None else (params.seed + i) % 2**62,
                chat=chat), self.deployment_name)
            for i in range(0, len(rendered), self.max_prompts)
        ]  # DeploymentResponses: nothing blocks until result()

        class _Resp:
            def result(_self) -> list[str]:
                return [clean_completion(row[0]) for r in responses for row in r.result()]

        return _Resp()

    def generate(self, prompts: list[str], params: SamplingParams) -> list[str]:
        return self.submit(prompts, params).result()

    def where(self) -> dict:
        """The nodes of this PLM's Serve replicas (from the GCS actor table: no dashboard needed)."""
        from ray._private.state import actors

        from serving.app import generator_deployment_name

        cls = f"ServeReplica:{self.app_name}:{generator_deployment_name(self.deployment_name)}"
        nodes = {a["Address"]["NodeID"] for a in actors(actor_state_name="ALIVE").values()
                 if a["ActorClassName"] == cls}
        return {"node_ids": sorted(nodes)}

    def close(self) -> None:
        close_serve_plms(self.app_name)


SERVE_APP = "dpsynth-pe-plms"


def placement_of(llm: LLM) -> dict:
    """Where one PLM runs: its actor's node and GPU ids, its Serve replicas' nodes, or this process."""
    if isinstance(llm, (RayActorLLM, ServeHandleLLM)):
        where = llm.where()
    elif isinstance(llm, OpenAICompatibleLLM):
        where = {"endpoint": "external"}
    else:  # in the driver's process
        where = {"node_id": ray.get_runtime_context().get_node_id() if ray.is_initialized() else None,
                 "in_driver": True}
    return {"plm": getattr(llm, "name", type(llm).__name__), **where}


def serve_deployment_names(plms: Sequence[PLMConfig]) -> list[str]:
    """Valid, unique Serve model names for the configured PLMs (``k-<display name>``)."""
    return [f"{k}-" + (re.sub(r"[^A-Za-z0-9._-]", "_", p.display_name)[:60]) for k, p in enumerate(plms)]


def deploy_serve_plms(plms: Sequence[PLMConfig], max_new_tokens: int = 512, app_name: str = SERVE_APP):
    """One Serve application holding one ``Generator`` deployment per PLM (``serving.app``), HTTP
    off (handles only). Returns ``(ingress handle, deployment names, serve config)``."""
    from serving.app import deploy
    from serving.config import ServeConfig

    names = serve_deployment_names(plms)
    config = ServeConfig(
        # PE's PLMs keep the dpsynth app (its Generator replicas, as measured for PE); `auto` is for
        # `dpsynth serve start`, where Ray's app serves HTTP clients
        app_name=app_name, app="dpsynth",
        models=[{"name": n, "model": p.model, "max_batch_size": p.batch_size, "num_cpus": r.cpus,
                 "num_gpus": r.gpus or 0, "torch_threads": p.num_threads, "max_ongoing_requests": 1024,
                 "backend": p.engine, "device": p.device, "dtype": p.dtype}
                for n, p, r in zip(names, plms, (plm_resources(p) for p in plms))],
        http={"enabled": False},
        limits={"max_tokens": max(512, max_new_tokens), "max_prompts": 64, "max_sequences": 256},
    )
    return deploy(config), names, config


def make_llms(plms: Sequence[PLMConfig], max_new_tokens: int = 512) -> list[LLM]:
    """One backend per configured PLM; actors are started together and awaited once; PLMs with
    ``backend: serve`` share one Serve app (one Generator deployment each)."""
    if any(p.backend in ("ray_actor", "serve") for p in plms):
        ensure_ray()  # join the cluster (RAY_ADDRESS / submitted job) or embed a local Ray
    serve_idx = [k for k, p in enumerate(plms) if p.backend == "serve"]
    serve_llms: dict[int, LLM] = {}
    if serve_idx:
        handle, names, config = deploy_serve_plms([plms[k] for k in serve_idx], max_new_tokens)
        for k, name in zip(serve_idx, names):
            serve_llms[k] = ServeHandleLLM(handle, name, plms[k].model, plms[k].display_name,
                                           max_prompts=config.limits.max_prompts, app_name=config.app_name)
    out: list[LLM] = []
    for k, p in enumerate(plms):
        if p.backend == "hf":
            out.append(LocalLLM(p.model, batch_size=p.batch_size, num_threads=p.num_threads, name=p.display_name,
                                engine=p.engine, device=p.device, dtype=p.dtype))
        elif p.backend == "ray_actor":
            out.append(RayActorLLM(p))
        elif p.backend == "serve":
            out.append(serve_llms[k])
        elif p.backend == "openai":
            if not p.base_url:
                raise ConfigError(f"plms[{k}].base_url is required for backend 'openai'")
            out.append(OpenAICompatibleLLM(p.base_url, p.model, api_key_env=p.api_key_env, name=p.display_name,
                                           max_concurrency=p.max_concurrent_requests, max_retries=p.max_retries))
        else:  # pragma: no cover - pydantic restricts the values
            raise ConfigError(f"plms[{k}].backend: unknown backend '{p.backend}'")
    for llm in out:
        if isinstance(llm, RayActorLLM):
            llm.wait_ready()
    return out


def close_serve_plms(app_name: str = SERVE_APP) -> None:
    """Delete the PE Serve app (other Serve apps keep running)."""
    from ray import serve

    try:
        serve.delete(app_name)
    except Exception:  # noqa: BLE001 - already gone / Serve not running
        pass
