"""ASGI middleware that caps request bodies on the stream, not on the declared ``Content-Length``.

A chunked upload declares no length: the old check let a 50 MB chunked body be read in full. Here
each ``http.request`` message is counted as it arrives; once the count passes the cap the app is
cut off (its reads fail, whatever it answers is dropped) and the client gets a 413 without the
rest being read. The error names the limit only, never any of the body.
"""

from __future__ import annotations

import json
from collections.abc import Callable


class BodyTooLarge(Exception):
    """Raised from ``receive`` when the body passes the cap (the app's own handling is overridden)."""


async def send_413(send, limit: int, declared: int | None = None) -> None:
    size = f"request body of {declared} bytes" if declared is not None else "request body"
    body = json.dumps({"error": {
        "message": f"{size} exceeds the limit of {limit} bytes (limits.max_body_bytes)",
        "type": "invalid_request_error", "param": None, "code": None,
    }}).encode()
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class BodyCapMiddleware:
    """``app.add_middleware(BodyCapMiddleware, max_bytes=lambda: 4 << 20)``."""

    def __init__(self, app, max_bytes: Callable[[], int]) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes()
        declared = dict(scope.get("headers") or []).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:  # refused before a byte of the body is read
            await send_413(send, limit, int(declared))
            return
        state = {"received": 0, "over": False, "started": False}

        async def capped_receive():
            if state["over"]:
                raise BodyTooLarge()
            message = await receive()
            if message["type"] == "http.request":
                state["received"] += len(message.get("body", b""))
                if state["received"] > limit:
                    state["over"] = True
                    raise BodyTooLarge()
            return message

        async def guarded_send(message) -> None:
            if state["over"]:
                return  # the app's answer to the failed read (400/500) is replaced by the 413
            if message["type"] == "http.response.start":
                state["started"] = True
            await send(message)

        try:
            await self.app(scope, capped_receive, guarded_send)
        except Exception:
            if not state["over"]:
                raise
        if state["over"] and not state["started"]:
            await send_413(send, limit)
