"""Serve under abuse (issue 19, item 7), on real Ray Serve with tiny-llama: a chunked body past the cap
is refused on the stream (413), empty prompts are 400, per-request work is capped (400), a request
past its deadline is cancelled (504), a full queue answers 503 + Retry-After, /ready reports overload
while /health stays liveness.

Two generators: ``tiny`` answers at once; ``slow`` holds one request (max_ongoing_requests 1) and
queues one more (max_queued_requests 1), and waits 10 s (the most the config allows) to fill a batch,
so any request to it outlives the 6 s request timeout: overload and timeouts are deterministic, not
races on CPU speed.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest

from serving.config import ServeConfig
from serving.schemas import GenerationRequest, RequestLimitError

BODY_CAP = 64 * 1024
RETRY_AFTER = 7


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(ray_session):
    from ray import serve

    from serving.app import deploy, http_url

    config = ServeConfig(
        app_name="dpsynth-test-limits",
        models=[
            {"name": "tiny", "model": "tiny-llama", "num_cpus": 0.25, "batch_wait_timeout_s": 0.0},
            {"name": "slow", "model": "tiny-llama", "num_cpus": 0.25, "max_batch_size": 8,
             "batch_wait_timeout_s": 10.0, "max_ongoing_requests": 1, "max_queued_requests": 1},
        ],
        http={"port": _free_port(), "ready_probe_timeout_s": 1.0},
        limits={"max_tokens": 64, "max_n": 8, "max_body_bytes": BODY_CAP, "max_tokens_per_prompt": 128,
                "max_tokens_per_request": 256, "request_timeout_s": 6.0, "retry_after_s": RETRY_AFTER},
    )
    try:
        serve.shutdown()  # HTTP options are cluster-wide: start Serve on our own port
    except Exception:
        pass
    handle = deploy(config)
    yield config, handle, http_url(config)
    serve.delete(config.app_name)
    serve.shutdown()


def _post(url: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json=body, timeout=timeout)


def _wait_ready(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(url + "/ready", timeout=10).status_code == 200:
            return
        time.sleep(0.2)
    raise AssertionError("/ready did not return to 200")


def _wait_in_flight(url: str, model: str, count: int, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if httpx.get(url + "/health", timeout=10).json()["in_flight"][model] >= count:
            return
        time.sleep(0.05)
    raise AssertionError(f"{count} requests to '{model}' did not reach the ingress within {timeout:g} s")


def _in_background(fn, *args) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    thread.start()
    return thread, out


def _result_or_error(response):
    """A Serve handle call's result, or the exception it ended with (refused, cancelled)."""
    try:
        return response.result(timeout_s=120)
    except Exception as exc:
        return exc


def _chunked_upload(url: str, total_bytes: int, chunk_bytes: int = 64 * 1024) -> tuple[str, int]:
    """POST a chunked body of up to ``total_bytes``, stopping as soon as the server answers.

    Returns (status line, bytes sent). Past the cap it sends at ~3 MB/s, so a server that answers
    on the stream stops the upload early; one that reads everything first lets all of it through.
    """
    parsed = urlparse(url)
    sock = socket.create_connection((parsed.hostname, parsed.port), timeout=10)
    sent = 0
    try:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {parsed.hostname}\r\nContent-Type: application/json"
                     "\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        frame = f"{chunk_bytes:x}\r\n".encode() + b"a" * chunk_bytes + b"\r\n"
        while sent < total_bytes:
            wait = 0.02 if sent > BODY_CAP else 0.0
            if select.select([sock], [], [], wait)[0]:
                break  # the server answered before the body ended
            try:
                sock.sendall(frame)
            except (BrokenPipeError, ConnectionResetError, socket.timeout):
                break
            sent += chunk_bytes
        else:
            sock.sendall(b"0\r\n\r\n")
        sock.settimeout(60)
        response = b""
        while b"\r\n" not in response:
            data = sock.recv(4096)
            if not data:
                break
            response += data
        return response.split(b"\r\n", 1)[0].decode(errors="replace"), sent
    finally:
        sock.close()


def test_chunked_oversized_body_is_refused_on_the_stream(served):
    _, _, url = served
    status, sent = _chunked_upload(url, total_bytes=50 * 1024 * 1024)
    assert " 413 " in status + " ", status
    assert sent < 16 * 1024 * 1024, f"{sent} bytes were sent before the 413"  # not the whole 50 MB
    # A declared Content-Length over the cap is refused before any of the body is read.
    r = httpx.post(url + "/v1/completions", content=b"x" * (BODY_CAP + 1), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "max_body_bytes" in r.json()["error"]["message"]
    # Bodies under the cap still work (the middleware passes the stream through).
    assert _post(url, {"model": "tiny", "prompt": "Hello", "max_tokens": 3}).status_code == 200


def test_empty_prompts_are_400_naming_the_field(served):
    _, handle, url = served
    r = _post(url, {"model": "tiny", "prompt": "", "max_tokens": 3})
    assert r.status_code == 400 and "'prompt[0]'" in r.json()["error"]["message"], r.text
    r = _post(url, {"model": "tiny", "prompt": ["fine", " \n\t "], "max_tokens": 3})
    assert r.status_code == 400 and "'prompt[1]'" in r.json()["error"]["message"], r.text
    r = httpx.post(url + "/v1/chat/completions", timeout=60,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "  "}], "max_tokens": 3})
    assert r.status_code == 400 and "'messages.0.content'" in r.json()["error"]["message"], r.text
    with pytest.raises(RequestLimitError, match=r"'prompt\[0\]'"):
        handle.generate.remote(GenerationRequest(prompts=[""], max_new_tokens=3), "tiny").result()


def test_work_per_request_is_capped(served):
    _, _, url = served
    # Each within max_n / max_tokens / max_sequences, but too much work together.
    r = _post(url, {"model": "tiny", "prompt": "x", "n": 4, "max_tokens": 64})
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "'n' x 'max_tokens'" in message and "max_tokens_per_prompt" in message
    r = _post(url, {"model": "tiny", "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 64})
    assert r.status_code == 400 and "max_tokens_per_request" in r.json()["error"]["message"], r.text
    r = _post(url, {"model": "tiny", "prompt": ["a", "b"], "n": 2, "max_tokens": 4})  # within both caps
    assert r.status_code == 200 and len(r.json()["choices"]) == 4


def test_request_past_its_deadline_is_cancelled_with_504(served):
    _, _, url = served
    _wait_ready(url)
    start = time.monotonic()
    r = _post(url, {"model": "slow", "prompt": "x", "max_tokens": 4})
    elapsed = time.monotonic() - start
    assert r.status_code == 504 and "request_timeout_s" in r.json()["error"]["message"], r.text
    assert elapsed < 9.5, elapsed  # answered at the 6 s deadline, not when the 10 s batch ran
    _wait_ready(url, timeout=15)  # the cancelled request freed its slot


def test_full_queue_answers_503_with_retry_after(served):
    _, _, url = served
    _wait_ready(url)
    body = {"model": "slow", "prompt": "x", "max_tokens": 4}
    # Both requests end at the 6 s request timeout, so the third must be answered inside that window. An
    # attempt is retried only if the machine was too slow to get there in 4.5 s; a third request admitted
    # sooner than that fails at once.
    for attempt in range(3):
        started = time.monotonic()
        held, _ = _in_background(_post, url, body)  # the replica's one slot
        _wait_in_flight(url, "slow", 1, timeout=10)
        time.sleep(0.3)
        queued, _ = _in_background(_post, url, body)  # the one queue place
        _wait_in_flight(url, "slow", 2, timeout=10)
        time.sleep(0.3)
        sent_at = time.monotonic() - started
        r = _post(url, body)
        if r.status_code == 503 or sent_at < 4.5:
            break
        held.join(30), queued.join(30)
        _wait_ready(url, timeout=15)
    assert r.status_code == 503, f"{r.text} (sent {sent_at:.1f} s after the first, attempt {attempt + 1})"
    assert r.headers.get("retry-after") == str(RETRY_AFTER) and "at capacity" in r.json()["error"]["message"]
    assert _post(url, {"model": "tiny", "prompt": "x", "max_tokens": 2}).status_code == 200  # others unaffected
    held.join(30), queued.join(30)


def test_ready_reports_overload_while_health_stays_liveness(served):
    _, handle, url = served
    _wait_ready(url)
    assert httpx.get(url + "/ready").json()["models"] == {"tiny": "ready", "slow": "ready"}
    # HTTP clients fill the slow model's slot and queue place: saturated. Each request ends at the 6 s
    # request timeout, so on a loaded machine they can reach the ingress, or /ready can be answered, too
    # late for that window. Such an attempt is retried only when /health shows the requests had already
    # ended; a "ready" answer while both are still in flight fails at once.
    for attempt in range(4):
        threads = [_in_background(_post, url, {"model": "slow", "prompt": "x", "max_tokens": 4})[0] for _ in range(2)]
        try:
            _wait_in_flight(url, "slow", 2, timeout=5.5)  # /health counts without pinging the replica
            r = httpx.get(url + "/ready", timeout=10)
            still_in_flight = httpx.get(url + "/health", timeout=10).json()["in_flight"]["slow"]
        except AssertionError:
            r, still_in_flight = None, 0
        if r is not None and r.json()["models"]["slow"].startswith("saturated"):
            break
        assert still_in_flight < 2, f"/ready said {r.text} while 2 requests were in flight"
        for thread in threads:
            thread.join(30)
        _wait_ready(url, timeout=15)
        assert attempt < 3, "two requests to 'slow' were never in flight together when /ready answered"
    assert r.status_code == 503 and r.json()["models"]["slow"].startswith("saturated"), r.text
    assert r.json()["models"]["tiny"] == "ready" and r.headers.get("retry-after") == str(RETRY_AFTER)
    assert httpx.get(url + "/health").status_code == 200  # liveness: the ingress answers
    for thread in threads:
        thread.join(30)
    _wait_ready(url, timeout=15)
    # A Python-handle caller (not counted by the ingress) holds the slot: the ping gets no answer. It holds the
    # slot for its 10 s batch wait once it reaches the replica, which on a loaded machine can take a while: /ready
    # is polled until it says so or the call has ended. A call can end unseen, and is then made again: a cancelled
    # earlier request can still hold the one queue place (refused at once), or the HTTP requests cancelled above
    # opened a 10 s batch window that Serve closes on time though they are gone (serve.batch drops cancelled
    # requests only when the batch runs), and the call joined that window just before it closed.
    trace = []
    for _ in range(3):
        start = time.monotonic()
        busy = handle.generate.remote(GenerationRequest(prompts=["x"], max_new_tokens=4), "slow")
        waiter, outcome = _in_background(_result_or_error, busy)
        polls = 0
        while ((r := httpx.get(url + "/ready", timeout=10)).status_code == 200 and waiter.is_alive()
               and time.monotonic() < start + 60):
            polls += 1
            time.sleep(0.2)
        trace.append(f"{r.status_code} after {polls} polls, {time.monotonic() - start:.1f} s, call "
                     + (f"ended: {type(outcome[0]).__name__}" if not waiter.is_alive() else "running"))
        if r.status_code == 503 or waiter.is_alive():
            break
        _wait_ready(url, timeout=15)  # the call ended unseen: refused at once, or joined a batch nearly done
    # the replica's own state, not the ingress's count ("saturated: N requests in flight"): the ping times out, or,
    # when an earlier probe's cancelled ping still holds the replica's queue place (a loaded machine), is refused
    probe = r.json()["models"]["slow"]
    assert r.status_code == 503, f"{r.text}; attempts: {trace}"
    assert probe.startswith("not answering") or probe == "saturated: request queue full", r.text
    busy.cancel()
    _wait_ready(url, timeout=15)
