"""Build and deploy the generation application from a :class:`ServeConfig`.

    app = build_generation_app(config)           # a Ray Serve Application (ingress: OpenAIIngress)
    handle = deploy(config)                      # serve.start(loopback HTTP) + serve.run; returns the ingress handle
    rows = await handle.generate.remote(GenerationRequest(prompts=["..."]))
"""

from __future__ import annotations

import hashlib
import logging
import os
import re

from ray import serve

from dpsynth_core.errors import ConfigError
from dpsynth_core.quiet import verbose
from serving.config import ModelDeploymentConfig, ServeConfig
from serving.deployments import BestOfN, Generator, MultiPLMRouter
from serving.openai_api import OpenAIIngress

log = logging.getLogger(__name__)


def generator_deployment_name(model_name: str) -> str:
    return "Generator_" + re.sub(r"[^A-Za-z0-9_-]", "_", model_name)


def api_key_digest(config: ServeConfig) -> str | None:
    """SHA-256 of the API key named by ``http.api_key_env`` (the key itself never leaves this process)."""
    name = config.http.api_key_env
    if name is None:
        return None
    key = os.environ.get(name)
    if not key:
        raise ConfigError(f"http.api_key_env: environment variable '{name}' is not set (or empty)")
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _generator_options(model: ModelDeploymentConfig, retry_after_s: int) -> dict:
    options: dict = {
        "name": generator_deployment_name(model.name),
        "ray_actor_options": {"num_cpus": model.num_cpus, "num_gpus": model.num_gpus},
        "max_ongoing_requests": model.ongoing_requests(),
        # Serve refuses what does not fit (BackPressureError; the ingress answers 503 + Retry-After).
        "max_queued_requests": model.queued_requests(),
        "backpressure_config": {"status_code": 503, "retry_after_s": retry_after_s},
    }
    if model.autoscaling is not None:
        a = model.autoscaling
        options["autoscaling_config"] = {
            "min_replicas": a.min_replicas, "max_replicas": a.max_replicas,
            "initial_replicas": max(a.min_replicas, 1), "target_ongoing_requests": a.target_ongoing_requests,
            "upscale_delay_s": a.upscale_delay_s, "downscale_delay_s": a.downscale_delay_s,
        }
    else:
        options["num_replicas"] = model.num_replicas
    return options


def _ray_llm_unavailable_reason(config: ServeConfig) -> str | None:
    """Why app 'ray_llm' cannot serve this config here (the first reason), or None when it can."""
    from dpsynth_core.engines.factory import vllm_unsupported_reason
    from serving.ray_llm import check_supported

    try:
        check_supported(config.model_copy(update={"app": "ray_llm"}))
    except ConfigError as exc:
        return str(exc)
    for m in config.models:
        reason = vllm_unsupported_reason(m.model, None if m.device == "auto" else m.device)
        if reason is not None:
            return f"model '{m.name}': {reason}"
    return None


def resolve_app(config: ServeConfig) -> ServeConfig:
    """``app: auto`` made concrete: Ray's ``ray_llm`` app where vLLM runs every model (the engines'
    factory decides), else the ``dpsynth`` app (HF replicas where vLLM cannot run); one line says which and why."""
    if config.app != "auto":
        return config
    reason = _ray_llm_unavailable_reason(config)
    if reason is None:
        log.warning("serve app: ray_llm (ray.serve.llm on vLLM) for %s", ", ".join(config.model_names()))
        return config.model_copy(update={"app": "ray_llm"})
    # each model's backend then resolves as configured (auto: HF where vLLM cannot run it)
    log.warning("serve app: dpsynth (ray_llm not used: %s)", reason)
    return config.model_copy(update={"app": "dpsynth"})


def build_generation_app(config: ServeConfig):
    """The whole app: one Generator deployment per configured model, BestOfN, MultiPLMRouter, ingress."""
    limits = config.limits.model_dump()
    retry_after_s = config.limits.retry_after_s
    generators = {
        m.name: Generator.options(**_generator_options(m, retry_after_s)).bind(m.model_dump(), limits)
        for m in config.models
    }
    best = BestOfN.bind(generators, config.best_of_n.model_dump(), limits, {m.name: m.capacity() for m in config.models})
    router = MultiPLMRouter.bind(generators)
    # HTTP beyond the ingress's own limits: Serve's proxy answers 503 + Retry-After.
    ingress = OpenAIIngress.options(
        max_ongoing_requests=config.http.max_ongoing_requests, max_queued_requests=config.http.max_queued_requests,
        backpressure_config={"status_code": 503, "retry_after_s": retry_after_s},
    )
    return ingress.bind(generators, best, router, config.model_dump(), api_key_digest(config))


def http_url(config: ServeConfig) -> str:
    """Base URL of the HTTP routes (the OpenAI client's ``base_url`` is this + ``/v1``)."""
    host = config.http.host
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{config.http.port}{config.http.route_prefix.rstrip('/')}"


def deploy(config: ServeConfig, *, blocking: bool = False):
    """Start Serve (HTTP on ``http.host:http.port``, loopback by default) and run the app.

    Ray must be initialised already (``ray.init(...)`` or ``ray.init("ray://...")``). HTTP options
    are cluster-wide in Serve: if Serve already runs with other options, those stay in force.
    Returns the ingress handle (``generate``, ``best_of_n``, ``generate_multi``, ``models``, ``stats``).
    """
    logs = serve_logging()
    if config.http.enabled:
        serve.start(http_options={"host": config.http.host, "port": config.http.port}, logging_config=logs)
    else:
        serve.start(proxy_location="Disabled", logging_config=logs)
    route = config.http.route_prefix if config.http.enabled else None
    config = resolve_app(config)
    if config.app == "ray_llm":
        from serving.ray_llm import build_ray_llm_app
        from serving.ray_llm_tools import build_ray_llm_tools_app, tools_app_name

        # Ray's OpenAI app takes the HTTP routes; Best-of-N and multi-PLM run over its engines in a
        # second app whose handle (the same API as the dpsynth app's) is returned
        serve.run(build_ray_llm_app(config, api_key_digest(config)), name=config.app_name, route_prefix=route,
                  logging_config=logs)
        return serve.run(build_ray_llm_tools_app(config), name=tools_app_name(config.app_name), route_prefix=None,
                         blocking=blocking, logging_config=logs)
    return serve.run(build_generation_app(config), name=config.app_name, route_prefix=route, blocking=blocking,
                     logging_config=logs)


def serve_logging() -> dict | None:
    """Serve's own log level in the controller, the proxy and every replica; Ray's default when verbose.

    Serve logs every deployment's options, every replica start and one access line per request at INFO,
    and warns that an engine took over 30 s to load (it does on CPU) or that a replica still loading did
    not report its queue: none of it is for a user to act on. Errors still show, a failed deploy raises
    in ``serve.run``, and our own code's notices (the ``dpsynth_core`` logger) are not Serve's.
    ``DPSYNTH_VERBOSE=1`` shows everything."""
    if verbose():
        return None
    # the driver's own "ray.serve" lines ("Started Serve", "Deployment Options" dumps, "is ready at")
    logging.getLogger("ray.serve").setLevel(logging.WARNING)
    return {"log_level": "ERROR", "enable_access_log": False}


def undeploy(config: ServeConfig) -> None:
    """Delete this app (other Serve apps on the cluster keep running)."""
    from serving.ray_llm_tools import tools_app_name

    if config.app != "dpsynth" and tools_app_name(config.app_name) in serve.status().applications:
        serve.delete(tools_app_name(config.app_name))
    serve.delete(config.app_name)
