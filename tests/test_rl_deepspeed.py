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
    assert payload["config"]["engine"] == "trl" and payload["config"]["use_accelerate"] is True
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
                 "dpsynth_core.actg.pipeline", "dpsynth_core.actg.data_split", "dpsynth_core.privacy.aim",
                 "ray_jobs.dp_finetune", "ray_jobs.actg")
    assert not [m for m in imported if m and m.startswith(forbidden)], imported
    from ray_jobs.rl_deepspeed import run_rl_deepspeed

    params = set(run_rl_deepspeed.__code__.co_varnames[: run_rl_deepspeed.__code__.co_argcount
                                                         + run_rl_deepspeed.__code__.co_kwonlyargcount])
    assert not params & {"ledger", "source", "examples", "data", "private_path"}


# --- the adapter save under ZeRO-3 (issue 15.2): gather the LoRA shards, rank 0 writes -----------------
class _RecordingGather:
    """Stands in for deepspeed.zero.GatheredParameters: records what is gathered and whether the
    save happened inside the gathered context."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, object]] = []
        self.inside = False

    def __call__(self, params, modifier_rank=None):
        self.calls.append((list(params), modifier_rank))
        return self

    def __enter__(self):
        self.inside = True

    def __exit__(self, *exc):
        self.inside = False


def _policy_with_reference():
    from peft import LoraConfig, get_peft_model

    from dpsynth_core.models import load_causal_lm

    base, _ = load_causal_lm("tiny-llama")
    policy = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    policy.add_adapter("ref", LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    return policy


def test_zero3_save_gathers_the_adapter_and_only_rank_0_writes(tmp_path):
    from ray_jobs.rl_deepspeed import save_gathered_adapter

    policy = _policy_with_reference()
    expected = {id(p) for n, p in policy.named_parameters() if ".lora_" in n and ".default." in n}
    saved_inside = []
    original = policy.save_pretrained

    for rank in (1, 0):
        gather = _RecordingGather()

        def save(*args, _gather=gather, **kwargs):
            saved_inside.append(_gather.inside)
            return original(*args, **kwargs)

        policy.save_pretrained = save
        wrote = save_gathered_adapter(policy, tmp_path / f"rank{rank}", rank=rank, gather=gather)
        (params, modifier_rank), = gather.calls  # every rank enters the collective once
        assert {id(p) for p in params} == expected and len(params) == len(expected) > 0
        assert modifier_rank is None  # a read: the gathered values are not written back to the shards
        assert wrote == (rank == 0) and (tmp_path / f"rank{rank}").exists() == (rank == 0)
    assert saved_inside == [True]  # rank 0 saved, while the weights were gathered

    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "rank0" / "adapter_model.safetensors"))
    assert weights and all("lora_" in k for k in weights) and not any(".ref." in k for k in weights)


def test_zero3_runner_saves_through_the_gathered_saver():
    """Structural: the Train loop hands run_anchored_rl the gathered saver, with the worker's rank."""
    tree = ast.parse(RUNNER.read_text())
    loop = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_train_loop")
    call = next(n for n in ast.walk(loop) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "run_anchored_rl")
    saver = next(k.value for k in call.keywords if k.arg == "save_adapter")
    assert ast.unparse(saver) == "functools.partial(save_gathered_adapter, rank=rank)"
