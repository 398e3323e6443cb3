"""Ray Serve generation service on real local Ray with tiny-llama: HTTP (openai client), handles,
Best-of-N, multi-PLM, validation, API key, batching."""

from __future__ import annotations

import socket

import httpx
import pytest

from serving.config import ServeConfig
from serving.schemas import BestOfNRequest, GenerationRequest, RequestLimitError

API_KEY = "test-key-123"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def served(ray_session):
    import os

    from ray import serve

    from serving.app import deploy, http_url

    os.environ["DPSYNTH_TEST_SERVE_KEY"] = API_KEY
    config = ServeConfig(
        app_name="dpsynth-test-generation",
        models=[
            {"name": "tiny-a", "model": "tiny-llama", "num_cpus": 0.5, "max_batch_size": 16, "batch_wait_timeout_s": 0.3},
            {"name": "tiny-b", "model": "tiny-llama", "num_cpus": 0.5},
        ],
        http={"port": _free_port(), "api_key_env": "DPSYNTH_TEST_SERVE_KEY"},
        limits={"max_tokens": 64, "max_n": 8},
    )
    try:
        serve.shutdown()  # HTTP options are cluster-wide: start Serve on our own port
    except Exception:
        pass
    handle = deploy(config)
    yield config, handle, http_url(config)
    serve.delete(config.app_name)
    serve.shutdown()


def _openai(url: str, key: str = API_KEY):
    import openai

    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)


def test_openai_client_completions_chat_models(served):
    _, _, url = served
    client = _openai(url)
    assert sorted(m.id for m in client.models.list()) == ["tiny-a", "tiny-b"]
    comp = client.completions.create(model="tiny-a", prompt=["Hello", "World"], max_tokens=6, n=2, seed=3)
    assert len(comp.choices) == 4 and sorted(c.index for c in comp.choices) == [0, 1, 2, 3]
    assert all(c.text for c in comp.choices) and comp.usage.completion_tokens > 0
    again = client.completions.create(model="tiny-a", prompt=["Hello", "World"], max_tokens=6, n=2, seed=3)
    assert [c.text for c in again.choices] == [c.text for c in comp.choices]  # seeded: reproducible
    chat = client.chat.completions.create(
        model="tiny-b", messages=[{"role": "user", "content": "Say hi"}], max_tokens=5, temperature=0
    )
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    assert chat.usage.prompt_tokens > 5  # the chat template wraps the message


def test_api_key_enforced(served):
    import openai

    _, _, url = served
    with pytest.raises(openai.AuthenticationError):
        _openai(url, key="wrong").models.list()
    assert httpx.get(url + "/v1/models").status_code == 401


def test_malformed_and_over_limit_requests(served):
    _, handle, url = served
    headers = {"Authorization": f"Bearer {API_KEY}"}
    post = lambda body: httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60)  # noqa: E731
    r = post({"model": "tiny-a", "max_tokens": 4})
    assert r.status_code == 422 and "'prompt'" in r.json()["error"]["message"]
    r = post({"model": "tiny-a", "prompt": "secret text", "max_tokens": -1})
    assert r.status_code == 422 and "secret text" not in r.text  # never echo the input
    r = post({"model": "tiny-a", "prompt": "x", "max_tokens": 10_000})
    assert r.status_code == 400 and "limit of 64" in r.json()["error"]["message"]
    r = post({"model": "tiny-a", "prompt": "x", "n": 9})
    assert r.status_code == 400 and "'n'" in r.json()["error"]["message"]
    r = post({"model": "tiny-a", "prompt": "x", "bogus": 1})
    assert r.status_code == 422
    r = post({"model": "tiny-a", "prompt": "x", "stream": True})
    assert r.status_code == 400
    assert post({"model": "nope", "prompt": "x"}).status_code == 404
    r = httpx.post(url + "/v1/completions", content=b"{not json", headers={**headers, "content-type": "application/json"})
    assert r.status_code == 422
    with pytest.raises(RequestLimitError):
        handle.generate.remote(GenerationRequest(prompts=["x"], max_new_tokens=10_000)).result()


def test_handle_generate_best_of_n_and_multi_plm(served):
    _, handle, _ = served
    rows = handle.generate.remote(GenerationRequest(prompts=["a", "b", "c"], n=2, max_new_tokens=4)).result()
    assert len(rows) == 3 and all(len(r) == 2 for r in rows)

    best = handle.best_of_n.remote(BestOfNRequest(
        prompts=["p1", "p2"], n=5, max_new_tokens=8, scorer=None,
        metadata=[{"target_words": 1}, {"target_words": 1}],
    )).result()
    assert len(best) == 2
    for res in best:
        assert len(res.scores) == 5 and len(res.candidates) == 5
        assert res.best_score == max(res.scores) and res.best == res.candidates[res.best_index]

    tagged = handle.generate_multi.remote(GenerationRequest(prompts=["q1", "q2"], max_new_tokens=4)).result()
    assert set(tagged) == {"tiny-a", "tiny-b"}
    assert all(len(v) == 2 and all(len(r) == 1 for r in v) for v in tagged.values())
    only_b = handle.generate_multi.remote(GenerationRequest(prompts=["q"], max_new_tokens=3), ["tiny-b"]).result()
    assert list(only_b) == ["tiny-b"]


def test_best_of_n_scorer_picks_highest(ray_session):
    from serving.deployments import BestOfN

    flat = ["one two three", "one", "one two"]
    score = BestOfN.func_or_class._score(
        ["p"], flat, [{"target_words": 2}], 3, __import__("serving.scorers", fromlist=["x"]).length_score
    )[0]
    assert score.best == "one two" and score.best_index == 2 and len(score.scores) == 3


def test_concurrent_requests_are_batched(served):
    _, handle, _ = served

    # .remote() does not block: all 12 requests are in flight before the first result is read.
    calls = [handle.generate.remote(GenerationRequest(prompts=[f"row {i}"], max_new_tokens=8)) for i in range(12)]
    results = [c.result() for c in calls]
    assert len(results) == 12
    stats = handle.stats.remote("tiny-a").result()
    assert stats["max_batch_size_seen"] > 1, stats
