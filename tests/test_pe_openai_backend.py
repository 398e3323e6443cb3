"""The OpenAI-compatible PLM backend against a local fake HTTP server: requests run concurrently but
never more than ``max_concurrency`` at once, transient errors (503) are retried, results keep the
prompt order, and a client error (400) is not retried."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from dpsynth_core.engines import SamplingParams
from dpsynth_core.pe.llm import OpenAICompatibleLLM


class FakeOpenAI:
    """POST /v1/chat/completions: echoes the prompt after a short sleep. Tracks the peak number of
    requests in flight; answers 503 to the first attempt of each prompt containing 'flaky' and 400 to
    prompts containing 'invalid'."""

    def __init__(self, delay_s: float = 0.1) -> None:
        self.delay_s = delay_s
        self.lock = threading.Lock()
        self.in_flight = self.peak = self.calls = 0
        self.failed_once: set[str] = set()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][0]["content"]
                with fake.lock:
                    fake.calls += 1
                    fake.in_flight += 1
                    fake.peak = max(fake.peak, fake.in_flight)
                try:
                    time.sleep(fake.delay_s)
                    if "invalid" in prompt:
                        return self._send(400, {"error": {"message": "bad request", "type": "invalid_request_error"}})
                    with fake.lock:
                        first = "flaky" in prompt and prompt not in fake.failed_once
                        fake.failed_once.add(prompt)
                    if first:
                        return self._send(503, {"error": {"message": "overloaded", "type": "server_error"}})
                    self._send(200, {
                        "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": f"echo {prompt}"}}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    })
                finally:
                    with fake.lock:
                        fake.in_flight -= 1

            def _send(self, code: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture()
def fake_api(monkeypatch):
    monkeypatch.setenv("FAKE_OPENAI_KEY", "not-a-real-key")
    server = FakeOpenAI()
    yield server
    server.close()


def test_requests_are_concurrent_bounded_retried_and_ordered(fake_api):
    llm = OpenAICompatibleLLM(fake_api.base_url, "fake", api_key_env="FAKE_OPENAI_KEY", max_concurrency=4,
                              max_retries=2)
    prompts = [f"prompt {i}" + (" flaky" if i % 5 == 0 else "") for i in range(20)]
    out = llm.generate(prompts, SamplingParams(max_new_tokens=8, top_p=0.95, seed=0))
    assert out == [f"echo {p}" for p in prompts]  # input order, each flaky prompt answered on its retry
    assert fake_api.peak == 4  # bounded, and actually concurrent (old code: 1 at a time)
    assert fake_api.calls == 20 + 4  # 4 flaky prompts failed once each


def test_client_errors_are_not_retried_and_transient_ones_give_up_after_max_retries(fake_api):
    import openai

    llm = OpenAICompatibleLLM(fake_api.base_url, "fake", api_key_env="FAKE_OPENAI_KEY", max_concurrency=2,
                              max_retries=3)
    with pytest.raises(openai.BadRequestError):
        llm.generate(["an invalid prompt"], SamplingParams(max_new_tokens=8, top_p=0.95, seed=0))
    assert fake_api.calls == 1
    no_retry = OpenAICompatibleLLM(fake_api.base_url, "fake", api_key_env="FAKE_OPENAI_KEY", max_retries=0)
    with pytest.raises(openai.InternalServerError):
        no_retry.generate(["flaky once"], SamplingParams(max_new_tokens=8, top_p=0.95, seed=0))
