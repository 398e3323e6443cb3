"""The dpsynth app's HTTP guarantees in front of Ray's OpenAI routes (app ``ray_llm``).

Ray's ingress (ray.serve.llm) has no API key, no per-request caps and no readiness route; this ASGI
layer, wrapped around its FastAPI app inside the ingress replica (serving.ray_llm_ingress), adds what
``LimitsConfig`` / ``HttpConfig`` promise for the ``dpsynth`` app:

- ``Authorization: Bearer <key>`` compared by SHA-256 digest when ``http.api_key_env`` is set (401);
- bodies capped on the stream (413, serving.body_cap) and completion / chat bodies checked against
  the caps of ``limits`` (400 naming the field, never the value) and for fields Ray's schema does
  not declare (422: it would accept and ignore them);
- ``limits.request_timeout_s`` per request (504, the request is cancelled);
- 503 + ``Retry-After`` once a model has as many requests in flight as its capacity;
- Ray's 400 for a malformed body stripped of the input it copies into ``error.param``;
- ``/health`` (liveness) and ``/ready`` (503 while a model is saturated or its LLMServer does not
  answer a health check within ``http.ready_probe_timeout_s``).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import Awaitable, Callable

from serving.body_cap import BodyCapMiddleware
from serving.config import ServeConfig
from serving.schemas import RequestLimitError, check_limits, check_work

_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


async def _send_json(send, status: int, payload: dict, headers: dict | None = None) -> None:
    body = json.dumps(payload).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _json_response(send, status: int, message: str, kind: str, headers: dict | None = None) -> None:
    """An OpenAI-shaped error: the message names the field or limit, never a value from the body."""
    await _send_json(send, status, {"error": {"message": message, "type": kind, "param": None, "code": None}}, headers)


async def _send_scrubbed(send, start: dict, body: bytes) -> None:
    """Ray's 400 answer without the input value its validation handler copies into ``error.param``."""
    try:
        payload = json.loads(body)
        payload["error"]["param"] = None
        body = json.dumps(payload).encode()
    except (ValueError, KeyError, TypeError):
        body = json.dumps({"error": {"message": "invalid request", "type": "invalid_request_error",
                                     "param": None, "code": None}}).encode()
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    await send({**start, "headers": headers + [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _route(scope) -> str:
    """The path below the app's route prefix (Serve passes the prefix as ``root_path``)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def _request_shape(path: str, body: dict) -> tuple[str | None, list[str], int, int]:
    """(model, prompts, max_tokens, n) of an OpenAI completion or chat body (types checked by Ray's schema)."""
    model = body.get("model") if isinstance(body.get("model"), str) else None
    n = body.get("n") if isinstance(body.get("n"), int) else 1
    if path.endswith("/chat/completions"):
        max_tokens = next((body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), 16)
        messages = body.get("messages") if isinstance(body.get("messages"), list) else []
        contents = [m.get("content") for m in messages if isinstance(m, dict)]
        prompts = ["".join(c if isinstance(c, str) else json.dumps(c) for c in contents)]
    else:
        max_tokens = body["max_tokens"] if body.get("max_tokens") is not None else 16
        prompt = body.get("prompt", "")
        prompts = [prompt] if isinstance(prompt, str) else [p if isinstance(p, str) else json.dumps(p) for p in prompt]
    return model, prompts, max_tokens if isinstance(max_tokens, int) else 16, n


class RayLLMGuard:
    """ASGI app: ``RayLLMGuard(ray_app, config, api_key_sha256, ping)``; ``ping(model)`` awaits the
    model's LLMServer health check."""

    def __init__(self, app, config: ServeConfig, api_key_sha256: str | None,
                 ping: Callable[[str], Awaitable[None]], known_fields: dict[str, frozenset[str]] | None = None) -> None:
        self.app = app
        # per route, the body fields Ray's request schema declares: it accepts (and ignores) any other,
        # so a misspelt option would silently do nothing; refused here as the dpsynth app does (422)
        self.known_fields = known_fields or {}
        self.config, self.limits = config, config.limits
        self.api_key_sha256 = api_key_sha256
        self.ping = ping
        self.capacity = {m.name: m.capacity() for m in config.models}
        self.in_flight = {m.name: 0 for m in config.models}
        self.capped = BodyCapMiddleware(self._checked, max_bytes=lambda: self.limits.max_body_bytes)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = _route(scope)
        if path == "/health":
            await _send_json(send, 200, {"status": "ok", "models": list(self.in_flight),
                                         "in_flight": dict(self.in_flight)})
            return
        if not self._authorised(scope):
            await _json_response(send, 401, "missing or invalid API key (send 'Authorization: Bearer <key>')",
                                 "authentication_error")
            return
        if path == "/ready":
            await self._ready(send)
            return
        await self.capped(scope, receive, send)

    def _authorised(self, scope) -> bool:
        if self.api_key_sha256 is None:
            return True
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        token = header[7:].strip() if header.lower().startswith("bearer ") else ""
        digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
        return bool(token) and hmac.compare_digest(digest, self.api_key_sha256)

    async def _checked(self, scope, receive, send) -> None:
        path = _route(scope)
        if scope.get("method") != "POST" or path not in _GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        chunks = []
        while True:  # the body is capped by BodyCapMiddleware around this
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        raw = b"".join(chunks)
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            body = None
        known = self.known_fields.get(path)
        unknown = sorted(k for k in body if k not in known) if known and isinstance(body, dict) else []
        if unknown:
            await _json_response(send, 422, f"invalid request: '{unknown[0]}': extra inputs are not permitted",
                                 "invalid_request_error")
            return
        if isinstance(body, dict):  # anything else is left to Ray's schema (422 / 400)
            model, prompts, max_tokens, n = _request_shape(path, body)
            try:
                for name, value in (("max_tokens", max_tokens), ("n", n)):
                    if value < 1:  # refused here, naming the field, before the engine sees it
                        raise RequestLimitError(f"'{name}': must be at least 1")
                check_limits(self.limits, prompts=prompts, max_new_tokens=max_tokens, n=n)
                check_work(self.limits, prompts=len(prompts), max_new_tokens=max_tokens, n=n)
            except RequestLimitError as exc:
                await _json_response(send, 400, str(exc), "invalid_request_error")
                return
        else:
            model = None
        replayed = {"done": False}

        async def replay():
            if replayed["done"]:
                return await receive()  # after the body: the disconnect message, as the server sends it
            replayed["done"] = True
            return {"type": "http.request", "body": raw, "more_body": False}

        await self._run(model, scope, replay, send)

    async def _run(self, model: str | None, scope, receive, send) -> None:
        """One generation request under the capacity of its model and the request timeout."""
        if model in self.in_flight and self.in_flight[model] >= self.capacity[model]:
            retry = self.limits.retry_after_s
            await _json_response(send, 503, f"model '{model}' is at capacity (its request queue is full); "
                                 f"retry in {retry} s", "overloaded_error", {"Retry-After": str(retry)})
            return
        started = {"flag": False}
        held: dict = {}

        async def tracked_send(message) -> None:
            # Ray's 400 for a malformed body puts the offending input in `param`: held back and scrubbed
            if message["type"] == "http.response.start":
                started["flag"] = True
                if message["status"] == 400:
                    held.update(start=message, body=b"")
                    return
            elif held:
                held["body"] += message.get("body", b"")
                if message.get("more_body"):
                    return
                await _send_scrubbed(send, held["start"], held["body"])
                return
            await send(message)

        if model in self.in_flight:
            self.in_flight[model] += 1
        try:
            await asyncio.wait_for(self.app(scope, receive, tracked_send), timeout=self.limits.request_timeout_s)
        except asyncio.TimeoutError:
            if not started["flag"]:
                await _json_response(send, 504, f"the request did not finish within {self.limits.request_timeout_s:g}"
                                     " s (limits.request_timeout_s) and was cancelled; lower n or max_tokens, or "
                                     "retry later", "timeout_error")
        finally:
            if model in self.in_flight:
                self.in_flight[model] -= 1

    async def _ready(self, send) -> None:
        states = dict(zip(self.in_flight, await asyncio.gather(*(self._state(m) for m in self.in_flight))))
        ok = all(state == "ready" for state in states.values())
        await _send_json(send, 200 if ok else 503, {"status": "ready" if ok else "overloaded", "models": states},
                         None if ok else {"Retry-After": str(self.limits.retry_after_s)})

    async def _state(self, model: str) -> str:
        if self.in_flight[model] >= self.capacity[model]:
            return f"saturated: {self.in_flight[model]} requests in flight, capacity {self.capacity[model]}"
        timeout = self.config.http.ready_probe_timeout_s
        try:
            await asyncio.wait_for(self.ping(model), timeout=timeout)
            return "ready"
        except asyncio.TimeoutError:
            return f"not answering within {timeout:g} s (replicas busy)"
        except Exception as exc:  # a dead or restarting replica: not ready, say what kind of failure
            return f"unavailable ({type(exc).__name__})"
