"""Anchored RL under DeepSpeed ZeRO-3 on Ray Train (issue 15.3): the runner gets only the RL stage's
artifacts (DP outputs and public files), never a private stage, data source or ledger; artifacts
inside the private data dir and a missing DeepSpeed are refused before Ray starts."""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

from dpsynth_core.actg.anchored_rl import AnchoredRLConfig, RLArtifacts
from dpsynth_core.errors import ConfigError, DataError

RUNNER = Path(__file__).resolve().parent.parent / "ray_jobs" / "rl_deepspeed.py"


def _artifacts(root: Path) -> RLArtifacts:
    root.mkdir(parents=True, exist_ok=True)
    for name in ("schema.yaml", "features.csv", "anchors.jsonl"):
        (root / name).write_text("x")
    (root / "adapter").mkdir(exist_ok=True)
    return RLArtifacts(schema_path=root / "schema.yaml", attributes_path=root / "features.csv",
                       anchors_path=root / "anchors.jsonl", base_model="tiny-llama", adapter_dir=root / "adapter",
                       prompt_template="{attributes}", text_description="a review")


def test_payload_holds_only_artifact_paths_and_public_config(tmp_path):
    from ray_jobs.rl_deepspeed import DEFAULT_DEEPSPEED_CONFIG, train_loop_payload

    ds = json.loads(DEFAULT_DEEPSPEED_CONFIG.read_text())
    assert ds["zero_optimization"]["stage"] == 3
    art = _artifacts(tmp_path / "run" / "artifacts")
    payload = train_loop_payload(art, AnchoredRLConfig(), ds, tmp_path / "rl")
    assert set(payload) == {"artifacts", "config", "deepspeed_config", "output_dir"}
    assert set(payload["artifacts"]) == set(RLArtifacts.model_fields)  # nothing beyond the RL artifacts
    assert payload["config"]["engine"] == "torch" and payload["config"]["use_accelerate"] is True
    json.dumps(payload)  # plain public values only (Ray's run state stringifies it)


def test_artifacts_inside_the_private_data_dir_are_refused_before_ray(tmp_path, monkeypatch):
    import ray

    from ray_jobs.rl_deepspeed import run_rl_deepspeed

    private = tmp_path / "private"
    monkeypatch.setenv("DPSYNTH_DATA_DIR", str(private))
    art = _artifacts(private / "leaked")
    started = ray.is_initialized()
    with pytest.raises(DataError, match="private data directory"):
        run_rl_deepspeed(art, AnchoredRLConfig(), tmp_path / "rl", use_gpu=False)
    assert ray.is_initialized() == started


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="checks the missing-DeepSpeed path")
def test_missing_deepspeed_is_a_config_error_before_ray(tmp_path, monkeypatch):
    import ray

    from ray_jobs.rl_deepspeed import run_rl_deepspeed

    monkeypatch.setenv("DPSYNTH_DATA_DIR", str(tmp_path / "private"))
    started = ray.is_initialized()
    with pytest.raises(ConfigError, match="DeepSpeed"):
        run_rl_deepspeed(_artifacts(tmp_path / "run"), AnchoredRLConfig(), tmp_path / "rl", use_gpu=False)
    assert ray.is_initialized() == started


def test_worker_env_enables_zero3_and_hides_the_private_data(tmp_path):
    from ray_jobs.rl_deepspeed import worker_env

    env = worker_env(tmp_path / "ds.json", tmp_path / "empty")
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == str(tmp_path / "ds.json")
    assert env["DPSYNTH_DATA_DIR"] == str(tmp_path / "empty")


def test_runner_cannot_reach_a_private_stage_or_the_ledger():
    """Structural: the module imports nothing that reads private data, trains with DP or records."""
    tree = ast.parse(RUNNER.read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    forbidden = ("dpsynth_core.dpsgd", "dpsynth_core.privacy", "dpsynth_core.data", "dpsynth_core.tabular",
                 "dpsynth_core.actg.pipeline", "dpsynth_core.actg.data_split", "dpsynth_core.actg.aim_mechanism",
                 "ray_jobs.dp_finetune", "ray_jobs.actg")
    assert not [m for m in imported if m and m.startswith(forbidden)], imported
    from ray_jobs.rl_deepspeed import run_rl_deepspeed

    params = set(run_rl_deepspeed.__code__.co_varnames[: run_rl_deepspeed.__code__.co_argcount
                                                         + run_rl_deepspeed.__code__.co_kwonlyargcount])
    assert not params & {"ledger", "source", "examples", "data", "private_path"}
