"""OpenAI-compatible HTTP ingress (``/v1/completions``, ``/v1/chat/completions``, ``/v1/models``).

The ``dpsynth`` app. Where vLLM runs every model, the default (``app: auto``) is Ray's own OpenAI app
(serving.ray_llm, with the same key, limits and /ready in front: serving.ray_llm_guard); this one stays
for what Ray's cannot do: HF replicas (models vLLM cannot run, e.g. head sizes its CPU kernels lack),
a LoRA adapter served unmerged (Ray loads adapters only from object storage), one engine over several
GPUs, and PE's Serve backend (ray_jobs.pe_backends pins it).

The same deployment is the app's Python entry point: ``serve.get_app_handle(name)`` gives a handle
with ``generate``, ``best_of_n``, ``generate_multi``, ``models`` and ``stats``.

Safety: bodies are validated (422) and capped (400; 413 past ``limits.max_body_bytes``, counted on
the stream) with messages that name the field, never echo the value; an optional API key is compared
by SHA-256 digest; nothing here logs a body.

Under load: each HTTP request's work (n x max_tokens, prompts x n x max_tokens) is capped (400); a
request still running after ``limits.request_timeout_s`` is cancelled (504); a model whose Serve
queue is full answers 503 with ``Retry-After``. ``/health`` is liveness (the ingress answers);
``/ready`` is readiness: 503 while a model's queue is saturated or a generator does not answer a
ping within ``http.ready_probe_timeout_s``.
"""

# No `from __future__ import annotations`: FastAPI must see real types on the Serve-wrapped methods.

import asyncio
import hashlib
import hmac
import time
import uuid
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from ray import serve
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from serving.body_cap import BodyCapMiddleware
from serving.config import ServeConfig
from serving.schemas import (
    BestOfNRequest,
    BestOfNResult,
    GenerationRequest,
    GenerationResult,
    RequestLimitError,
    UnknownModelError,
    check_limits,
    check_work,
)

api = FastAPI(title="dpsynth generation", docs_url=None, redoc_url=None, openapi_url=None)
_MAX_BODY = {"bytes": 4 * 1024 * 1024}  # set from the config when the ingress starts


class APIError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.headers = status, message, kind, param, headers


def _error(status: int, message: str, kind: str, param: str | None = None, headers: dict | None = None
           ) -> JSONResponse:
    return JSONResponse(status_code=status, headers=headers,
                        content={"error": {"message": message, "type": kind, "param": param, "code": None}})


@api.exception_handler(APIError)
async def _api_error(_: Request, exc: APIError) -> JSONResponse:
    return _error(exc.status, exc.message, exc.kind, exc.param, exc.headers)


@api.exception_handler(RequestValidationError)
async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
    # FastAPI's default echoes the offending input back; we name the field and the rule only.
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "body"
        parts.append(f"'{loc}': {err.get('msg', 'invalid')}")
    return _error(422, "invalid request: " + "; ".join(parts), "invalid_request_error")


api.add_middleware(BodyCapMiddleware, max_bytes=lambda: _MAX_BODY["bytes"])


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class CompletionBody(_Body):
    model: str
    prompt: str | list[str]
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict | None = None
    user: str | None = None


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "developer"]
    content: str | list[dict]
    name: str | None = None


class ChatBody(_Body):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    n: int = Field(1, ge=1)
    seed: int | None = Field(None, ge=0)
    stop: str | list[str] | None = None
    stream: bool = False
    logprobs: bool | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict | None = None
    user: str | None = None


def _reject_unsupported(body: BaseModel) -> None:
    fields = body.model_fields_set
    checks = [
        ("stream", bool(getattr(body, "stream", False)), "streaming is not supported"),
        ("echo", bool(getattr(body, "echo", False)), "echo is not supported"),
        ("logprobs", bool(getattr(body, "logprobs", None)), "logprobs are not supported"),
        ("best_of", getattr(body, "best_of", None) not in (None, 1), "use n, or the Best-of-N handle API"),
        ("suffix", bool(getattr(body, "suffix", None)), "suffix is not supported"),
        ("frequency_penalty", body.frequency_penalty != 0.0, "only 0 is supported"),
        ("presence_penalty", body.presence_penalty != 0.0, "only 0 is supported"),
        ("logit_bias", bool(body.logit_bias), "logit_bias is not supported"),
    ]
    for name, bad, why in checks:
        if name in fields and bad:
            raise APIError(400, f"'{name}': {why}", param=name)


def _stops(stop: str | list[str] | None) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > 4:
        raise APIError(400, f"'stop': at most 4 stop sequences, got {len(stops)}", param="stop")
    return stops


def _message_text(message: ChatMessage, index: int) -> str:
    if isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise APIError(400, f"'messages.{index}.content': only text parts are supported", param="messages")
        texts.append(part["text"])
    return "".join(texts)


def _nonempty_text(message: ChatMessage, index: int) -> str:
    text = _message_text(message, index)
    if not text.strip():
        raise APIError(400, f"'messages.{index}.content': must not be empty or whitespace-only", param="messages")
    return text


async def _awaited(response):
    return await response


def cause_message(exc: BaseException) -> str:
    """The message of the original error, without the remote traceback Ray wraps around it."""
    return str(getattr(exc, "cause", None) or exc)


def _usage(result: GenerationResult) -> dict:
    prompt = sum(row[0].prompt_tokens for row in result.completions if row)
    completion = sum(s.completion_tokens for row in result.completions for s in row)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@serve.deployment(max_ongoing_requests=512, ray_actor_options={"num_cpus": 0})
@serve.ingress(api)
class OpenAIIngress:
    def __init__(self, generators: dict, best_of_n, router, config: dict, api_key_sha256: str | None) -> None:
        self.generators = generators  # name -> DeploymentHandle
        self.best_of_n_handle = best_of_n
        self.router = router
        self.config = ServeConfig.model_validate(config)
        self.limits = self.config.limits
        self.api_key_sha256 = api_key_sha256
        _MAX_BODY["bytes"] = self.limits.max_body_bytes
        self.created = int(time.time())
        self.capacity = {m.name: m.capacity() for m in self.config.models}
        self.in_flight = {name: 0 for name in self.generators}  # this ingress's calls per model

    # ---- helpers -------------------------------------------------------------------------
    def _authorize(self, request: Request) -> None:
        if self.api_key_sha256 is None:
            return
        header = request.headers.get("authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else request.headers.get("x-api-key", "")
        digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
        if not token or not hmac.compare_digest(digest, self.api_key_sha256):
            raise APIError(401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                           kind="authentication_error")

    def _generator(self, model: str | None):
        name = model or next(iter(self.generators))
        if name not in self.generators:
            raise UnknownModelError(f"'model': unknown model '{name}'; served: {', '.join(self.generators)}")
        return self.generators[name]

    def _deadline(self) -> float:
        return time.monotonic() + self.limits.request_timeout_s

    async def _call(self, model: str | None, method: str, *args, deadline: float):
        """One generator call under the request's deadline; Serve's refusals and the timeout as HTTP errors."""
        name = model or next(iter(self.generators))
        response = getattr(self._generator(name), method).remote(*args)
        self.in_flight[name] += 1
        try:
            return await asyncio.wait_for(_awaited(response), timeout=max(deadline - time.monotonic(), 0.0))
        except asyncio.TimeoutError:
            response.cancel()  # the replica stops decoding this request's rows
            raise APIError(504, f"the request did not finish within {self.limits.request_timeout_s:g} s "
                                "(limits.request_timeout_s) and was cancelled; lower n or max_tokens, or retry later",
                           kind="timeout_error") from None
        except BackPressureError:
            retry = self.limits.retry_after_s
            raise APIError(503, f"model '{name}' is at capacity (its request queue is full); retry in {retry} s",
                           kind="overloaded_error", headers={"Retry-After": str(retry)}) from None
        except DeploymentUnavailableError:
            raise APIError(503, f"model '{name}' is not available right now", kind="overloaded_error",
                           headers={"Retry-After": str(self.limits.retry_after_s)}) from None
        except RequestLimitError as exc:  # raised in the replica, re-raised here as a subclass
            raise APIError(400, cause_message(exc)) from None
        except UnknownModelError as exc:
            raise APIError(404, cause_message(exc), kind="not_found_error", param="model") from None
        finally:
            self.in_flight[name] -= 1

    async def _run(self, model: str, request: GenerationRequest, deadline: float) -> GenerationResult:
        return await self._call(model, "generate_detailed", request, deadline=deadline)

    def _checked(self, *, model: str, prompts: list[str], max_tokens: int, n: int, generated: int | None = None
                 ) -> None:
        """``generated``: how many prompts are generated from (chat: 1, whatever the number of messages)."""
        try:
            self._generator(model)
            check_limits(self.limits, prompts=prompts, max_new_tokens=max_tokens, n=n)
            check_work(self.limits, prompts=len(prompts) if generated is None else generated,
                       max_new_tokens=max_tokens, n=n)
        except UnknownModelError as exc:
            raise APIError(404, str(exc), kind="not_found_error", param="model") from None
        except RequestLimitError as exc:
            raise APIError(400, str(exc)) from None

    # ---- HTTP routes ---------------------------------------------------------------------
    @api.get("/v1/models")
    async def list_models(self, request: Request) -> dict:
        self._authorize(request)
        return {"object": "list", "data": [
            {"id": name, "object": "model", "created": self.created, "owned_by": "dpsynth"} for name in self.generators
        ]}

    @api.get("/health")
    async def health(self) -> dict:
        """Liveness: the ingress answers. ``in_flight``: this ingress's calls per model, counted without
        touching a replica (/ready pings them)."""
        return {"status": "ok", "models": list(self.generators), "in_flight": dict(self.in_flight)}

    @api.get("/ready")
    async def ready(self) -> JSONResponse:
        """Readiness: 200 only if every model has queue room and its generator answers a ping in time."""
        names = list(self.generators)
        states = dict(zip(names, await asyncio.gather(*(self._probe(name) for name in names))))
        ok = all(state == "ready" for state in states.values())
        headers = None if ok else {"Retry-After": str(self.limits.retry_after_s)}
        return JSONResponse(status_code=200 if ok else 503, headers=headers,
                            content={"status": "ready" if ok else "overloaded", "models": states})

    async def _probe(self, name: str) -> str:
        if self.in_flight[name] >= self.capacity[name]:
            return f"saturated: {self.in_flight[name]} requests in flight, capacity {self.capacity[name]}"
        timeout = self.config.http.ready_probe_timeout_s
        response = self.generators[name].ping.remote()
        try:
            await asyncio.wait_for(_awaited(response), timeout=timeout)
            return "ready"
        except asyncio.TimeoutError:
            response.cancel()
            return f"not answering within {timeout:g} s (replicas busy)"
        except BackPressureError:
            return "saturated: request queue full"
        except Exception as exc:  # a dead or restarting replica: not ready, say what kind of failure
            return f"unavailable: {type(exc).__name__}"

    @api.post("/v1/completions")
    async def completions(self, body: CompletionBody, request: Request) -> dict:
        self._authorize(request)
        _reject_unsupported(body)
        prompts = [body.prompt] if isinstance(body.prompt, str) else list(body.prompt)
        if not prompts:
            raise APIError(400, "'prompt': must not be empty", param="prompt")
        self._checked(model=body.model, prompts=prompts, max_tokens=body.max_tokens, n=body.n)
        result = await self._run(body.model, GenerationRequest(
            prompts=prompts, max_new_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
            n=body.n, seed=body.seed, stop=_stops(body.stop),
        ), self._deadline())
        choices = [
            {"text": s.text, "index": i * body.n + j, "logprobs": None, "finish_reason": s.finish_reason}
            for i, row in enumerate(result.completions) for j, s in enumerate(row)
        ]
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
                "model": body.model, "choices": choices, "usage": _usage(result)}

    @api.post("/v1/chat/completions")
    async def chat_completions(self, body: ChatBody, request: Request) -> dict:
        self._authorize(request)
        _reject_unsupported(body)
        max_tokens = body.max_completion_tokens or body.max_tokens or min(256, self.limits.max_tokens)
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": _nonempty_text(m, k)}
                    for k, m in enumerate(body.messages)]
        self._checked(model=body.model, prompts=[m["content"] for m in messages], max_tokens=max_tokens, n=body.n,
                      generated=1)
        deadline = self._deadline()
        rendered = await self._call(body.model, "render_chat", messages, deadline=deadline)
        self._checked(model=body.model, prompts=[rendered], max_tokens=max_tokens, n=body.n)
        result = await self._run(body.model, GenerationRequest(
            prompts=[rendered], max_new_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
            n=body.n, seed=body.seed, stop=_stops(body.stop), chat=True,
        ), deadline)
        choices = [
            {"index": j, "message": {"role": "assistant", "content": s.text}, "logprobs": None,
             "finish_reason": s.finish_reason}
            for j, s in enumerate(result.completions[0])
        ]
        return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": body.model, "choices": choices, "usage": _usage(result)}

    # ---- Python handle API (serve.get_app_handle(app_name).<method>.remote(...)) ----------
    async def generate(self, request: GenerationRequest, model: str | None = None) -> list[list[str]]:
        """``n`` completions per prompt from ``model`` (default: the first configured model)."""
        return await self._generator(model).generate.remote(request)

    async def generate_detailed(self, request: GenerationRequest, model: str | None = None) -> GenerationResult:
        return await self._generator(model).generate_detailed.remote(request)

    async def best_of_n(self, request: BestOfNRequest) -> list[BestOfNResult]:
        return await self.best_of_n_handle.best_of_n.remote(request)

    async def generate_multi(self, request: GenerationRequest, plms: list[str] | None = None) -> dict:
        return await self.router.generate.remote(request, plms)

    def models(self) -> list[str]:
        return list(self.generators)

    async def stats(self, model: str | None = None) -> dict:
        """Batching statistics of one replica of ``model`` (the one the router picks)."""
        return await self._generator(model).stats.remote()
