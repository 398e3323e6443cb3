"""Ray's own LLM layers: the ``ray_llm`` Serve app (ray.serve.llm) and the ``ray_data_llm`` batch
runner (ray.data.llm). Everywhere: the configs they are built from. With vllm installed (as
`make install` does): the app answers OpenAI completions over HTTP, Best-of-N and multi-PLM run over its
engines, and the runner writes every row."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pandas as pd
import pytest
from vllm_gate import require_vllm

from dpsynth_core.engines.vllm_cpu import cpu_dtype
from dpsynth_core.errors import ConfigError
from ray_jobs.batch_generate import BatchGenerateConfig, resolve_runner
from serving.config import ModelDeploymentConfig, ServeConfig
from serving.ray_llm import check_supported, llm_config_kwargs


def test_llm_config_carries_our_vllm_settings_and_cpu_placement() -> None:
    model = ModelDeploymentConfig(name="smol", kv_cache_gib=2, num_cpus=1.5, num_replicas=2,
                                  vllm_engine_kwargs={"max_num_seqs": 8, "model": "elsewhere"})
    kwargs = llm_config_kwargs(model, "/models/smol", max_prompt_tokens=3000)
    engine = kwargs["engine_kwargs"]
    # seeded CPU sampling dies on split prefills; vLLM must never log prompts (they may be private)
    assert engine["enable_chunked_prefill"] is False and engine["enable_log_requests"] is False
    assert engine["enforce_eager"] is True and engine["dtype"] == cpu_dtype("auto") and engine["max_num_seqs"] == 8
    assert engine["max_model_len"] == 3000 and "model" not in engine  # Ray owns model / tokenizer
    assert kwargs["runtime_env"]["env_vars"]["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert kwargs["accelerator_config"] == {"kind": "cpu"}
    assert kwargs["placement_group_config"] == {"bundles": [{"CPU": 1.5}]}
    assert kwargs["deployment_config"]["num_replicas"] == 2
    assert kwargs["deployment_config"]["ray_actor_options"] == {"num_cpus": 0}  # the bundle is the whole replica
    assert kwargs["model_loading_config"] == {"model_id": "smol", "model_source": "/models/smol"}


def test_llm_config_keeps_the_replica_as_quiet_as_the_caller(monkeypatch) -> None:
    """The replica's vLLM logs at the caller's level (the CLI sets ERROR) and its env_vars start from the job's
    (ensure_ray's quiet env and setup hook): Ray replaces a job's env_vars whole with an actor's own."""
    import serving.ray_llm as ray_llm

    model = ModelDeploymentConfig(name="smol")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")
    monkeypatch.setattr(ray_llm, "job_env_vars", lambda: {"HOOK": "dpsynth_core.quiet.ray_worker_setup",
                                                          "VLLM_CPU_KVCACHE_SPACE": "9"})
    env = llm_config_kwargs(model, "/m", max_prompt_tokens=100)["runtime_env"]["env_vars"]
    assert env["VLLM_LOGGING_LEVEL"] == "ERROR" and env["HOOK"] == "dpsynth_core.quiet.ray_worker_setup"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4"  # the model's own settings win over the job's
    # our worker setup, not Ray LLM's no-op one: the replica and the tasks it starts log as quietly as the job
    assert llm_config_kwargs(model, "/m", max_prompt_tokens=100)["runtime_env"]["worker_process_setup_hook"] \
        == "dpsynth_core.quiet.ray_worker_setup"
    monkeypatch.delenv("VLLM_LOGGING_LEVEL")
    assert llm_config_kwargs(model, "/m", max_prompt_tokens=100)["runtime_env"]["env_vars"]["VLLM_LOGGING_LEVEL"] \
        == "WARNING"  # as the offline engine's default (engines.vllm_engine.vllm_process_env)


def test_a_local_model_skips_ray_llms_download_task(tmp_path) -> None:
    """Before its engine starts, a replica runs a Ray task per node that "downloads" the model: for a local
    directory a fresh worker that returns the path unchanged. Our callback skips it there, never for remote storage."""
    import asyncio

    require_vllm("ray.serve.llm")
    from ray.serve.llm import LLMConfig

    from serving.ray_llm_node import LocalModelNodeInit

    kwargs = llm_config_kwargs(ModelDeploymentConfig(name="smol"), str(tmp_path), max_prompt_tokens=100)
    assert kwargs["callback_config"] == {"callback_class": "serving.ray_llm_node:LocalModelNodeInit"}
    for source, runs_the_task in ((str(tmp_path), False), (str(tmp_path / "absent"), True),
                                  ("s3://bucket/model", True)):
        config = LLMConfig(**{**kwargs, "model_loading_config": {"model_id": "smol", "model_source": source}})
        callback = LocalModelNodeInit(llm_config=config)
        asyncio.run(callback.on_before_node_init())
        assert callback.ctx.run_init_node is runs_the_task, source


def test_llm_config_on_a_gpu_asks_for_one() -> None:
    kwargs = llm_config_kwargs(ModelDeploymentConfig(name="g", num_gpus=1), "/m", max_prompt_tokens=100)
    assert kwargs["placement_group_config"] == {"bundles": [{"CPU": 1.0, "GPU": 1}]}
    assert "accelerator_config" not in kwargs and "enforce_eager" not in kwargs["engine_kwargs"]


def test_ray_llm_app_refuses_what_it_cannot_honour(monkeypatch) -> None:
    monkeypatch.setenv("E14_KEY", "secret")
    with pytest.raises(ConfigError, match="vLLM only"):
        check_supported(ServeConfig(app="ray_llm", models=[{"name": "a", "backend": "hf"}]))
    with pytest.raises(ConfigError, match="merged only"):
        check_supported(ServeConfig(app="ray_llm", models=[{"name": "a", "adapter_dir": "/a", "merge_adapter": False}]))
    check_supported(ServeConfig(app="ray_llm", models=[{"name": "a"}]))  # the plain case passes
    # the API key is now checked in front of Ray's routes (serving.ray_llm_guard): no longer refused
    check_supported(ServeConfig(app="ray_llm", models=[{"name": "a"}], http={"api_key_env": "E14_KEY"}))
    assert ServeConfig(models=[{"name": "a"}]).app == "auto"  # the default: ray_llm where vLLM runs


def test_ray_data_llm_runner_is_vllm_only(tmp_path) -> None:
    with pytest.raises(ValueError, match="vLLM only"):
        BatchGenerateConfig(prompt="p", runner="ray_data_llm", engine="hf", output_dir=tmp_path)
    assert BatchGenerateConfig(prompt="p", output_dir=tmp_path).runner == "auto"
    # auto: actors where the engine is HF, and always for constrained rows (their logits processor)
    assert resolve_runner(BatchGenerateConfig(prompt="p", model="tiny-llama", output_dir=tmp_path)) == "actors"
    assert resolve_runner(BatchGenerateConfig(prompt="p", logits_processor="m:f", output_dir=tmp_path)) == "actors"
    assert resolve_runner(BatchGenerateConfig(prompt="p", engine="hf", output_dir=tmp_path)) == "actors"


# --- vLLM (installed by make install; skipped only where it could not be, failed under CI) ----------

@pytest.fixture
def ray_with_vllm(request):
    """The session's Ray, only where vllm and Ray's LLM layers import (no Ray start just to skip)."""
    require_vllm("ray.serve.llm", "ray.data.llm")
    return request.getfixturevalue("ray_session")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


RAY_LLM_KEY = "ray-llm-test-key"


def _post(url: str, payload: dict, key: str | None = RAY_LLM_KEY) -> dict:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=900) as response:
        return json.loads(response.read())


def _status(url: str, payload: dict | None = None, key: str | None = RAY_LLM_KEY) -> int:
    try:
        if payload is None:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
                return response.status
        _post(url, payload, key)
        return 200
    except urllib.error.HTTPError as exc:
        return exc.code


def test_ray_llm_app_serves_openai_and_runs_best_of_n_and_multi_plm(ray_with_vllm, monkeypatch) -> None:
    """One deployment of Ray's app with our tools on top (an engine start per model: the suite's slowest
    part, so one model), chosen by default (no `app:`) since vLLM runs SmolLM2: OpenAI completions over
    HTTP under the API key and the caps of `limits`, /ready; Best-of-N and multi-PLM whose candidates come
    from Ray's LLMServer replica; the handle API is the dpsynth app's; undeploy removes both apps. The
    router's choice among several PLMs is the dpsynth app's (tests/test_serve_generation.py, two models);
    a second engine here cost 29 s of deploy alone (85 s against 56 s)."""
    from ray import serve

    from serving.app import deploy, http_url, undeploy
    from serving.schemas import BestOfNRequest, GenerationRequest

    monkeypatch.setenv("RAY_LLM_TEST_KEY", RAY_LLM_KEY)
    smol = {"model": "smollm2-135m-instruct", "kv_cache_gib": 1, "num_cpus": 0.5}
    config = ServeConfig(app_name="ray-llm-test", http={"port": _free_port(), "api_key_env": "RAY_LLM_TEST_KEY"},
                         limits={"max_tokens": 64, "max_body_bytes": 4096},
                         best_of_n={"scorer": "serving.scorers:length_score"},
                         models=[{"name": "smol", **smol}])
    handle = deploy(config)
    try:
        apps = serve.status().applications
        assert {"ray-llm-test", "ray-llm-test-tools"} <= set(apps)  # `auto` chose Ray's app
        base = http_url(config)
        # the dpsynth app's HTTP guarantees hold on Ray's routes too
        assert _status(f"{base}/ready") == 200 and _status(f"{base}/health", key=None) == 200
        assert _status(f"{base}/v1/completions", {"model": "smol", "prompt": "Hi", "max_tokens": 4}, key=None) == 401
        assert _status(f"{base}/v1/completions", {"model": "smol", "prompt": "Hi", "max_tokens": 65}) == 400
        assert _status(f"{base}/v1/completions", {"model": "smol", "prompt": "x" * 5000, "max_tokens": 4}) == 413
        completion = _post(f"{base}/v1/completions", {"model": "smol", "prompt": "Cells divide", "max_tokens": 8,
                                                      "temperature": 1.0, "seed": 3})
        assert 0 < completion["usage"]["completion_tokens"] <= 8 and isinstance(completion["choices"][0]["text"], str)
        chat = _post(f"{base}/v1/chat/completions", {"model": "smol", "max_tokens": 8,
                                                     "messages": [{"role": "user", "content": "Name a cell organelle."}]})
        assert 0 < chat["usage"]["completion_tokens"] <= 8 and chat["choices"][0]["message"]["role"] == "assistant"
        results = handle.best_of_n.remote(BestOfNRequest(prompts=["Cells divide", "Proteins fold"], n=3,
                                                          max_new_tokens=12, seed=5)).result()
        assert len(results) == 2
        for r in results:
            assert len(r.candidates) == 3 and len(r.scores) == 3
            assert r.best == r.candidates[r.best_index] and r.best_score == max(r.scores)
        multi = handle.generate_multi.remote(GenerationRequest(prompts=["Name a cell organelle."], n=2,
                                                               max_new_tokens=8)).result()
        assert set(multi) == {"smol"}  # each PLM is a Ray LLMServer by its model id
        assert all(len(rows) == 1 and len(rows[0]) == 2 and all(isinstance(t, str) for t in rows[0])
                   for rows in multi.values())
        # the same seed gives the same candidates (row seeds go to vLLM per request)
        again = handle.generate.remote(GenerationRequest(prompts=["Cells divide"], n=2, max_new_tokens=8, seed=9),
                                       "smol").result()
        assert again == handle.generate.remote(GenerationRequest(prompts=["Cells divide"], n=2, max_new_tokens=8,
                                                                 seed=9), "smol").result()
        assert handle.stats.remote("smol").result()["tokens_generated"] > 0
    finally:
        undeploy(config)
    assert not {"ray-llm-test", "ray-llm-test-tools"} & set(serve.status().applications)


def test_ray_data_llm_engine_actor_is_as_quiet_as_the_job(monkeypatch, tmp_path) -> None:
    """The engine actor's env_vars replace the job's whole: they start from the job's quiet environment, vLLM
    logs at the caller's level (it printed ~150 WARNING lines at Ray LLM's WARNING), and the actor runs our
    worker setup instead of Ray LLM's no-op one."""
    require_vllm("ray.data.llm")
    import serving.ray_llm as ray_llm
    from ray_jobs.ray_llm_batch import processor_config

    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")
    monkeypatch.setattr(ray_llm, "job_env_vars", lambda: {"HF_HUB_DISABLE_PROGRESS_BARS": "1"})
    config = BatchGenerateConfig(prompt="p", model="smollm2-135m-instruct", runner="ray_data_llm", output_dir=tmp_path)
    runtime_env = processor_config(config).runtime_env
    assert runtime_env["worker_process_setup_hook"] == "dpsynth_core.quiet.ray_worker_setup"
    assert runtime_env["env_vars"]["VLLM_LOGGING_LEVEL"] == "ERROR"
    assert runtime_env["env_vars"]["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"


def test_ray_data_llm_runner_writes_every_row(ray_with_vllm, tmp_path) -> None:
    from ray_jobs.batch_generate import run

    config = BatchGenerateConfig(model="smollm2-135m-instruct", prompt="Name one cell organelle.", chat=True, num_rows=6,
                                 max_new_tokens=8, runner="ray_data_llm", batch_size=6, shard_size=6, cpus_per_actor=0.5,
                                 output_dir=tmp_path / "out")
    assert run(config)["rows_generated"] == 6
    frame = pd.read_parquet(tmp_path / "out" / "shard-00000.parquet")
    assert frame["id"].tolist() == list(range(6)) and (frame["prompt"] == "Name one cell organelle.").all()
    assert frame["text"].map(lambda t: isinstance(t, str) and len(t) > 0).all()
