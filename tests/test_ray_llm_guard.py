"""The key, caps, timeout, back-pressure and /ready that app 'ray_llm' puts in front of Ray's OpenAI
routes (serving.ray_llm_guard), on a stand-in ASGI app: no Ray, no engine."""

from __future__ import annotations

import asyncio
import hashlib
import json

import pytest

from serving.app import resolve_app
from serving.config import ServeConfig
from serving.ray_llm_guard import RayLLMGuard

KEY = "guard-test-key"


class _StandIn:
    """Answers 200 after ``delay_s`` (the engine's work); records the bodies it was given."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s, self.bodies = delay_s, []

    async def __call__(self, scope, receive, send) -> None:
        message = await receive()
        self.bodies.append(message.get("body", b""))
        await asyncio.sleep(self.delay_s)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}", "more_body": False})


def _guard(inner, ping=None, **limits) -> RayLLMGuard:
    config = ServeConfig(models=[{"name": "m", "max_ongoing_requests": 1, "max_queued_requests": 1}],
                         http={"ready_probe_timeout_s": 0.2},
                         limits={"max_tokens": 32, "max_n": 2, "max_body_bytes": 2048, "request_timeout_s": 0.3,
                                 "retry_after_s": 7, **limits})

    async def answers(_model):
        return None

    known = {"/v1/completions": frozenset({"model", "prompt", "max_tokens", "n"}),
             "/v1/chat/completions": frozenset({"model", "messages", "max_tokens", "n"})}
    return RayLLMGuard(inner, config, hashlib.sha256(KEY.encode()).hexdigest(), ping or answers, known)


async def _call(guard, path: str, body: dict | None = None, key: str | None = KEY, method: str = "POST"):
    raw = json.dumps(body).encode() if body is not None else b""
    headers = [(b"content-length", str(len(raw)).encode())]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": headers}
    sent = []

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message):
        sent.append(message)

    await guard(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body_bytes = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), json.loads(body_bytes)


def _completion(**fields) -> dict:
    return {"model": "m", "prompt": "Cells divide", "max_tokens": 8, **fields}


def test_key_and_caps_are_checked_before_the_engine_sees_a_request() -> None:
    inner = _StandIn()
    guard = _guard(inner)
    assert asyncio.run(_call(guard, "/v1/completions", _completion(), key=None))[0] == 401
    assert asyncio.run(_call(guard, "/v1/completions", _completion(), key="wrong"))[0] == 401
    status, _, body = asyncio.run(_call(guard, "/v1/completions", _completion(max_tokens=33)))
    assert status == 400 and "'max_tokens'" in body["error"]["message"]
    status, _, body = asyncio.run(_call(guard, "/v1/chat/completions",
                                        {"model": "m", "n": 3, "messages": [{"role": "user", "content": "SECRET"}]}))
    assert status == 400 and "'n'" in body["error"]["message"] and "SECRET" not in json.dumps(body)
    status, _, body = asyncio.run(_call(guard, "/v1/completions", _completion(prompt="x" * 4000)))
    assert status == 413 and "max_body_bytes" in body["error"]["message"]
    status, _, body = asyncio.run(_call(guard, "/v1/completions", _completion(bogus_field=1)))
    assert status == 422 and "'bogus_field'" in body["error"]["message"]
    assert asyncio.run(_call(guard, "/v1/completions", _completion(prompt=["ok", "  \n "])))[0] == 400
    status, _, body = asyncio.run(_call(guard, "/v1/completions", _completion(max_tokens=0)))
    assert status == 400 and "'max_tokens': must be at least 1" in body["error"]["message"]
    assert inner.bodies == []  # none of the refused requests reached Ray's app
    status, _, _ = asyncio.run(_call(guard, "/v1/completions", _completion()))
    assert status == 200 and json.loads(inner.bodies[0]) == _completion()  # the body reaches it unchanged


def test_timeout_is_504_and_a_full_model_is_503_with_retry_after() -> None:
    guard = _guard(_StandIn(delay_s=5.0))
    status, _, body = asyncio.run(_call(guard, "/v1/completions", _completion()))
    assert status == 504 and "request_timeout_s" in body["error"]["message"]

    async def two_at_capacity():
        guard.capacity["m"] = 1
        first = asyncio.create_task(_call(guard, "/v1/completions", _completion()))
        await asyncio.sleep(0.05)
        ready = await _call(guard, "/ready", method="GET")
        second = await _call(guard, "/v1/completions", _completion())
        return await first, ready, second

    first, ready, second = asyncio.run(two_at_capacity())
    assert first[0] == 504 and second[0] == 503 and second[1][b"retry-after"] == b"7"
    assert ready[0] == 503 and ready[2]["models"]["m"].startswith("saturated")
    assert guard.in_flight == {"m": 0}  # every request released its slot


def test_ready_pings_the_engines_and_health_needs_no_key() -> None:
    async def stuck(_model):
        await asyncio.sleep(5)

    assert asyncio.run(_call(_guard(_StandIn()), "/ready", key=KEY, method="GET"))[0] == 200
    status, headers, body = asyncio.run(_call(_guard(_StandIn(), ping=stuck), "/ready", method="GET"))
    assert status == 503 and headers[b"retry-after"] == b"7" and "not answering" in body["models"]["m"]
    assert asyncio.run(_call(_guard(_StandIn()), "/ready", key=None, method="GET"))[0] == 401
    assert asyncio.run(_call(_guard(_StandIn()), "/health", key=None, method="GET"))[0] == 200


def test_auto_app_keeps_dpsynth_where_vllm_cannot_run_the_model() -> None:
    assert ServeConfig(models=[{"name": "a"}]).app == "auto"
    # tiny-llama's head size (16) is not one vLLM's CPU attention implements; backend hf never runs on vLLM
    assert resolve_app(ServeConfig(models=[{"name": "a", "model": "tiny-llama"}])).app == "dpsynth"
    assert resolve_app(ServeConfig(models=[{"name": "a", "backend": "hf"}])).app == "dpsynth"
    assert resolve_app(ServeConfig(app="ray_llm", models=[{"name": "a", "model": "tiny-llama"}])).app == "ray_llm"


def test_ray_validation_answer_loses_the_input_it_echoes() -> None:
    async def ray_400(scope, receive, send):  # as Ray's handler answers a malformed field
        await receive()
        body = json.dumps({"error": {"message": "Invalid request format: bad at ('body', 'prompt')",
                                     "param": "SECRET PROMPT", "code": "invalid_parameter"}}).encode()
        await send({"type": "http.response.start", "status": 400,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    status, headers, body = asyncio.run(_call(_guard(ray_400), "/v1/completions", _completion()))
    assert status == 400 and body["error"]["param"] is None and "SECRET" not in json.dumps(body)
    assert int(headers[b"content-length"]) == len(json.dumps(body).encode())


@pytest.mark.parametrize("path", ["/v1/models", "/tokenize"])
def test_other_routes_pass_through_under_the_key(path) -> None:
    inner = _StandIn()
    assert asyncio.run(_call(_guard(inner), path, method="GET"))[0] == 200
    assert asyncio.run(_call(_guard(inner), path, key=None, method="GET"))[0] == 401
