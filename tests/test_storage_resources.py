"""Run storage locations and stage resource requests (no Ray: the cluster tests use them for real)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpsynth_core.actg.pipeline import ActgConfig
from dpsynth_core.errors import ConfigError
from dpsynth_core.pe.config import PEConfig
from dpsynth_core.config.resources import PipelineResources
from dpsynth_core.runs.storage import JOB_ENV_VAR, require_durable_run_dir

PE = {"method": "augpe", "data": {"classes": ["a", "b"]}}


def test_run_dir_takes_a_file_uri_and_refuses_unknown_stores_clearly():
    assert ActgConfig(run_dir="file:///mnt/shared/runs/a%20b").run_dir == Path("/mnt/shared/runs/a b")
    assert PEConfig(**PE, run_dir="file:///mnt/shared/pe").run_dir == Path("/mnt/shared/pe")
    assert PEConfig(**PE, run_dir="runs/pe").run_dir == Path("runs/pe")
    with pytest.raises(ValueError, match=r"abfs:// run storage is not supported \(use s3://, gs://"):
        ActgConfig(run_dir="abfs://container/runs/x")  # s3:// and gs://: tests/test_storage_object_store.py
    with pytest.raises(ValueError, match="not a host"):
        PEConfig(**PE, run_dir="file://otherhost/runs/x")


def test_relative_run_dir_is_refused_only_inside_a_submitted_job(monkeypatch, tmp_path):
    monkeypatch.delenv(JOB_ENV_VAR, raising=False)
    assert require_durable_run_dir(Path("runs/x")) == Path("runs/x").resolve()  # a laptop run: fine
    monkeypatch.setenv(JOB_ENV_VAR, "{}")
    with pytest.raises(ConfigError, match=r"run_dir 'runs/x' is relative.*set run_dir to shared storage"):
        require_durable_run_dir(Path("runs/x"))
    assert require_durable_run_dir(tmp_path / "runs") == tmp_path / "runs"


def test_stage_resources_inherit_and_are_not_the_runs_identity():
    res = PipelineResources(cpus=4, memory_gb=2, stages={"private": {"gpus": 1}})
    assert res.for_stage("private").ray_options() == {"num_cpus": 4, "num_gpus": 1, "memory": 2 * 1024**3}
    assert res.for_stage("generate").ray_options() == {"num_cpus": 4, "num_gpus": 0, "memory": 2 * 1024**3}
    assert PipelineResources().for_stage("x").ray_options(max_cpus=1) == {"num_cpus": 1, "num_gpus": 0}
    assert PipelineResources().for_stage("x").ray_options(max_cpus=16) == {"num_cpus": 2, "num_gpus": 0}
    gpu = ActgConfig(resources={"stages": {"private": {"gpus": 1}}})
    assert gpu.model_dump_json() == ActgConfig().model_dump_json()  # a resumed run may get another cluster
