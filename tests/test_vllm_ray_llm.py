"""Ray's own LLM layers: the ``ray_llm`` Serve app (ray.serve.llm) and the ``ray_data_llm`` batch
runner (ray.data.llm). Everywhere: the configs they are built from. With vllm installed (make
test-vllm): the app answers OpenAI completions over HTTP and the runner writes every row."""

from __future__ import annotations

import json
import socket
import urllib.request

import pandas as pd
import pytest

from dpsynth_core.errors import ConfigError
from ray_jobs.batch_generate import BatchGenerateConfig
from serving.config import ModelDeploymentConfig, ServeConfig
from serving.ray_llm import check_supported, llm_config_kwargs


def test_llm_config_carries_our_vllm_settings_and_cpu_placement() -> None:
    model = ModelDeploymentConfig(name="smol", kv_cache_gib=2, num_cpus=1.5, num_replicas=2,
                                  vllm_engine_kwargs={"max_num_seqs": 8, "model": "elsewhere"})
    kwargs = llm_config_kwargs(model, "/models/smol", max_prompt_tokens=3000)
    engine = kwargs["engine_kwargs"]
    # seeded CPU sampling dies on split prefills; vLLM must never log prompts (they may be private)
    assert engine["enable_chunked_prefill"] is False and engine["enable_log_requests"] is False
    assert engine["enforce_eager"] is True and engine["dtype"] == "bfloat16" and engine["max_num_seqs"] == 8
    assert engine["max_model_len"] == 3000 and "model" not in engine  # Ray owns model / tokenizer
    assert kwargs["runtime_env"]["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert kwargs["accelerator_config"] == {"kind": "cpu"}
    assert kwargs["placement_group_config"] == {"bundles": [{"CPU": 1.5}]}
    assert kwargs["deployment_config"]["num_replicas"] == 2
    assert kwargs["model_loading_config"] == {"model_id": "smol", "model_source": "/models/smol"}


def test_llm_config_on_a_gpu_asks_for_one() -> None:
    kwargs = llm_config_kwargs(ModelDeploymentConfig(name="g", num_gpus=1), "/m", max_prompt_tokens=100)
    assert kwargs["placement_group_config"] == {"bundles": [{"CPU": 1.0, "GPU": 1}]}
    assert "accelerator_config" not in kwargs and "enforce_eager" not in kwargs["engine_kwargs"]


def test_ray_llm_app_refuses_what_it_cannot_honour(monkeypatch) -> None:
    monkeypatch.setenv("E14_KEY", "secret")
    with pytest.raises(ConfigError, match="API key"):
        check_supported(ServeConfig(app="ray_llm", models=[{"name": "a"}], http={"api_key_env": "E14_KEY"}))
    with pytest.raises(ConfigError, match="vLLM only"):
        check_supported(ServeConfig(app="ray_llm", models=[{"name": "a", "backend": "hf"}]))
    check_supported(ServeConfig(app="ray_llm", models=[{"name": "a"}]))  # the plain case passes
    assert ServeConfig(models=[{"name": "a"}]).app == "dpsynth"


def test_ray_data_llm_runner_is_vllm_only(tmp_path) -> None:
    with pytest.raises(ValueError, match="vLLM only"):
        BatchGenerateConfig(prompt="p", runner="ray_data_llm", engine="hf", output_dir=tmp_path)
    assert BatchGenerateConfig(prompt="p", output_dir=tmp_path).runner == "actors"


# --- vLLM (skipped unless vllm and ray[llm] are installed) -----------------------------------------

@pytest.fixture
def ray_with_vllm(request):
    """The session's Ray, only where vllm and Ray's LLM layers import (no Ray start just to skip)."""
    pytest.importorskip("vllm")
    pytest.importorskip("ray.serve.llm")
    pytest.importorskip("ray.data.llm")
    return request.getfixturevalue("ray_session")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, payload: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=900) as response:
        return json.loads(response.read())


def test_ray_llm_app_serves_openai_completions(ray_with_vllm) -> None:
    from ray import serve

    from serving.app import deploy, http_url

    config = ServeConfig(app="ray_llm", app_name="ray-llm-test", http={"port": _free_port()},
                         models=[{"name": "smol", "model": "smollm2-135m-instruct", "kv_cache_gib": 1, "num_cpus": 0.5}])
    deploy(config)
    try:
        base = http_url(config)
        completion = _post(f"{base}/v1/completions", {"model": "smol", "prompt": "Cells divide", "max_tokens": 8,
                                                      "temperature": 1.0, "seed": 3})
        assert 0 < completion["usage"]["completion_tokens"] <= 8 and isinstance(completion["choices"][0]["text"], str)
        chat = _post(f"{base}/v1/chat/completions", {"model": "smol", "max_tokens": 8,
                                                     "messages": [{"role": "user", "content": "Name a cell organelle."}]})
        assert 0 < chat["usage"]["completion_tokens"] <= 8 and chat["choices"][0]["message"]["role"] == "assistant"
    finally:
        serve.delete(config.app_name)


def test_ray_data_llm_runner_writes_every_row(ray_with_vllm, tmp_path) -> None:
    from ray_jobs.batch_generate import run

    config = BatchGenerateConfig(model="smollm2-135m-instruct", prompt="Name one cell organelle.", chat=True, num_rows=6,
                                 max_new_tokens=8, runner="ray_data_llm", batch_size=6, shard_size=6, cpus_per_actor=0.5,
                                 output_dir=tmp_path / "out")
    assert run(config)["rows_generated"] == 6
    frame = pd.read_parquet(tmp_path / "out" / "shard-00000.parquet")
    assert frame["id"].tolist() == list(range(6)) and (frame["prompt"] == "Name one cell organelle.").all()
    assert frame["text"].map(lambda t: isinstance(t, str) and len(t) > 0).all()
