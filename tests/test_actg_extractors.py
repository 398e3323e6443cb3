"""Attribute extractors on known strings: embedding zero-shot, LM choice scoring (tiny-llama), and
the OpenAI-compatible client against a local HTTP stub serving a canned chat completion."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import numpy as np
import pytest

from dpsynth_core.actg.extractor_base import ifacc_scores, snap_to_option
from dpsynth_core.actg.extractors import (
    ExtractorConfig,
    LMChoiceExtractor,
    OpenAIExtractor,
    build_extractor,
)
from dpsynth_core.actg.schema import builtin_schema
from dpsynth_core.errors import ConfigError, DataError

NEURO = ("We recorded action potentials from hippocampal neurons and show that synaptic plasticity "
         "at excitatory synapses in the brain depends on NMDA receptors and dendritic spikes.")
PLANT = ("Arabidopsis thaliana roots respond to drought: leaf stomata, chlorophyll and plant "
         "photosynthesis genes in this flowering plant are regulated by abscisic acid.")
CANCER = "Tumour cells from breast cancer patients metastasize; oncogene KRAS drives carcinoma growth."


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """The tiny model is dominated by thread sync on a busy 2-core box: one thread is ~5x faster."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def schema():
    return builtin_schema("biorxiv")


@pytest.fixture(scope="module")
def embedding_extractor(schema):
    return build_extractor("embedding", schema)


def test_embedding_extractor_known_strings(schema, embedding_extractor):
    rows = embedding_extractor.extract([NEURO, PLANT, CANCER])
    assert rows[0]["primary_research_area"] == "Neuroscience"
    assert rows[1]["model_organism"] == "Arabidopsis thaliana"
    assert rows[2]["disease_mention"] == "Cancer"
    for row in rows:
        schema.validate_row(row)  # every field present, every value an option
    assert embedding_extractor.extract([]) == []


def test_ifacc(schema, embedding_extractor):
    got = embedding_extractor.extract([NEURO])[0]
    target = dict(got)
    assert embedding_extractor.ifacc([NEURO], [target]) == [1.0]
    wrong = dict(target, primary_research_area="Ecology", model_organism="Zebrafish"
                 if got["model_organism"] != "Zebrafish" else "Human")
    assert embedding_extractor.ifacc([NEURO], [wrong]) == [pytest.approx(6 / 8)]
    with pytest.raises(DataError, match="2 texts but 1"):
        embedding_extractor.ifacc([NEURO, PLANT], [target])
    assert ifacc_scores([{"a": "x", "b": "y"}], [{"a": "x", "b": "z"}], ["a", "b"]) == [0.5]


def test_lm_extractor_tiny_llama_valid_options_and_cache_exact(schema):
    from dpsynth_core.models import load_causal_lm

    pair = load_causal_lm("tiny-llama")
    cached = LMChoiceExtractor(schema, model=pair, max_text_tokens=64)
    plain = LMChoiceExtractor(schema, model=pair, max_text_tokens=64, use_cache=False)
    a, b = cached.option_scores(NEURO), plain.option_scores(NEURO)
    for f in schema.fields:
        assert a[f.name].shape == (len(f.options),) and np.all(np.isfinite(a[f.name]))
        np.testing.assert_allclose(a[f.name], b[f.name], atol=1e-4)  # KV reuse changes nothing
    rows = cached.extract([NEURO, PLANT])
    assert len(rows) == 2
    for row in rows:
        assert schema.validate_row(row) == row
    # Length normalisation: the mean, not the sum, of token log-probs
    raw = LMChoiceExtractor(schema, model=pair, max_text_tokens=64, length_normalise=False,
                            calibrate=False).option_scores(NEURO)
    lens = np.array([len(ids) for ids in cached._option_ids["sample_size"]])
    np.testing.assert_allclose(raw["sample_size"] / lens, a["sample_size"], rtol=1e-4, atol=1e-5)


def test_snap_to_option(schema):
    f = schema.field("model_organism")
    assert snap_to_option("Mouse/Rat", f) == "Mouse/Rat"
    assert snap_to_option("  mouse/rat. ", f) == "Mouse/Rat"
    assert snap_to_option("Zebra fish", f) == "Zebrafish"
    assert snap_to_option("The organism is Escherichia coli", f) == "Escherichia coli"
    assert snap_to_option(None, f) == "Other"
    assert snap_to_option("qwertyuiop", schema.field("sample_size")) in schema.options("sample_size")


class _Stub(BaseHTTPRequestHandler):
    requests: list = []
    answer = ""

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        payload = {
            "id": "cmpl-1", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": type(self).answer}}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
        }
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture()
def stub_server():
    server = HTTPServer(("127.0.0.1", 0), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    _Stub.requests = []
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def test_openai_extractor_against_local_stub(schema, stub_server, monkeypatch):
    monkeypatch.setenv("DPSYNTH_TEST_KEY", "sk-test-123")
    _Stub.answer = ("Sure.\n```json\n" + json.dumps({
        "primary_research_area": "neuroscience", "model_organism": "Mouse / Rat",
        "experimental_approach": "Wet Lab Experimentation", "dominant_data_type": "Imaging",
        "research_focus_scale": "Circuit / Network", "disease_mention": "No Specific Disease Mentioned",
        "sample_size": "Relies on Cell/Animal Replicates",
    }) + "\n```")  # research_goal missing on purpose
    ex = build_extractor(ExtractorConfig(kind="openai", model="oracle-7b", base_url=stub_server,
                                         api_key_env="DPSYNTH_TEST_KEY", max_workers=2), schema)
    rows = ex.extract([NEURO, PLANT])
    assert len(_Stub.requests) == 2
    req = _Stub.requests[0]
    assert req["path"] == "/v1/chat/completions" and req["auth"] == "Bearer sk-test-123"
    assert req["body"]["model"] == "oracle-7b"
    assert any(NEURO in r["body"]["messages"][0]["content"] for r in _Stub.requests)
    row = rows[0]
    assert row["primary_research_area"] == "Neuroscience" and row["model_organism"] == "Mouse/Rat"
    assert row["research_goal"] == "Other"  # missing field -> fallback option, counted
    assert ex.stats["missing_fields"] == 2 and ex.stats["unparsed"] == 0
    assert schema.validate_row(row) == row
    _Stub.answer = "I cannot help with that."
    assert ex.extract([CANCER])[0] == ex.parse_answer("")
    assert ex.stats["unparsed"] >= 1


def test_openai_key_only_from_environment(schema, monkeypatch):
    monkeypatch.delenv("DPSYNTH_ABSENT_KEY", raising=False)
    with pytest.raises(ConfigError, match="DPSYNTH_ABSENT_KEY is not set"):
        OpenAIExtractor(schema, model="gpt", api_key_env="DPSYNTH_ABSENT_KEY", allow_external_processing=True)
    with pytest.raises(ConfigError, match="needs 'model'"):
        build_extractor({"kind": "openai", "base_url": "http://127.0.0.1:9/v1"}, schema)
    with pytest.raises(Exception):
        ExtractorConfig(kind="regex")


@pytest.mark.parametrize("base_url", [None, "https://api.openai.com/v1", "http://10.0.0.5:8000/v1", "http://llm.example.org/v1"])
def test_private_texts_are_not_sent_off_this_machine_unless_allowed(schema, base_url, monkeypatch):
    """The extractor reads raw private texts: a non-loopback endpoint (or the hosted API) is refused
    when the config is validated, before any client exists, unless the owner opts in."""
    monkeypatch.setenv("DPSYNTH_TEST_KEY", "sk-test")
    with pytest.raises(ConfigError, match="allow_external_processing"):
        ExtractorConfig(kind="openai", model="m", base_url=base_url)
    with pytest.raises(ConfigError, match="not on this machine"):
        OpenAIExtractor(schema, model="m", base_url=base_url, api_key_env="DPSYNTH_TEST_KEY")
    allowed = ExtractorConfig(kind="openai", model="m", base_url=base_url, allow_external_processing=True,
                              api_key_env="DPSYNTH_TEST_KEY")
    assert build_extractor(allowed, schema).model == "m"  # built, nothing sent


@pytest.mark.parametrize("base_url,local", [("http://127.0.0.1:8000/v1", True), ("http://localhost:8000/v1", True),
                                            ("http://[::1]:8000/v1", True), ("127.0.0.2:9000", True),
                                            ("http://192.168.1.4/v1", False), ("http://localhost.evil.com/v1", False),
                                            (None, False)])
def test_loopback_detection(base_url, local):
    from dpsynth_core.privacy.endpoints import is_loopback_url

    assert is_loopback_url(base_url) is local
