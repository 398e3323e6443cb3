"""Issue 15.1, ACTG side: the DP generator's sampling, Best-of-N / reward scoring (LM judge) and the
anchored RL policy each take ``device``/``dtype`` and resolve them through ``dpsynth_core.config.placement``
at the stage's entry, before a file is read."""

from __future__ import annotations

import pytest
import torch

from rl_reference import load_trainable_policy

from dpsynth_core.actg.anchored_rl import AnchoredRLConfig, RLArtifacts, run_anchored_rl
from dpsynth_core.actg.extractors import build_extractor
from dpsynth_core.actg.generator import GenerationSettings, open_generator
from dpsynth_core.actg.pipeline import ActgConfig
from dpsynth_core.actg.schema import schema_from_dict
from dpsynth_core.actg.stages_post import stage_best_of_n, stage_generate
from dpsynth_core.errors import ConfigError
from tests.placement_probe import LoaderReached, asked_for_gpu_bf16, fake_gpu, save_tiny_adapter  # noqa: F401

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
SCHEMA = schema_from_dict({"name": "mini", "fields": [
    {"name": "topic", "description": "Topic", "options": ["Neuroscience", "Ecology"]}]})


def _unreadable_artifacts(tmp_path) -> RLArtifacts:
    """Artifacts that exist but fail as soon as they are read (DataError / ValueError)."""
    for name in ("schema.yaml", "features.csv", "anchors.jsonl"):
        (tmp_path / name).write_text("{not: [valid")
    (tmp_path / "adapter").mkdir()
    return RLArtifacts(schema_path=tmp_path / "schema.yaml", attributes_path=tmp_path / "features.csv",
                       anchors_path=tmp_path / "anchors.jsonl", base_model="tiny-llama",
                       adapter_dir=tmp_path / "adapter", prompt_template="{description}", text_description="t")


@needs_no_gpu
def test_rl_forced_onto_cuda_fails_before_any_artifact_is_read(tmp_path):
    with pytest.raises(ConfigError, match="field 'rl.device': 'cuda' requested"):
        run_anchored_rl(_unreadable_artifacts(tmp_path), AnchoredRLConfig(device="cuda"), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@needs_no_gpu
def test_rl_policy_auto_is_cpu_fp32_and_bf16_base_keeps_fp32_lora(tmp_path):
    adapter = save_tiny_adapter(tmp_path / "adapter")
    policy, _ = load_trainable_policy("tiny-llama", adapter, placement=AnchoredRLConfig().placement())
    assert {(p.device.type, p.dtype) for p in policy.parameters()} == {("cpu", torch.float32)}
    policy, _ = load_trainable_policy("tiny-llama", adapter, with_reference=True,
                                      placement=AnchoredRLConfig(device="cpu", dtype="bf16").placement())
    trainable = {p.dtype for p in policy.parameters() if p.requires_grad}
    frozen = {p.dtype for p in policy.parameters() if not p.requires_grad}
    assert trainable == {torch.float32} and frozen == {torch.bfloat16}


def test_rl_policy_on_a_gpu_node_asks_for_cuda_bf16(fake_gpu, tmp_path):
    with pytest.raises(LoaderReached) as err:
        load_trainable_policy("tiny-llama", tmp_path, placement=AnchoredRLConfig().placement())
    assert asked_for_gpu_bf16(err.value)


# --- generation (candidates, plain samples) ----------------------------------------------------------
@needs_no_gpu
def test_generate_stage_forced_onto_cuda_fails_before_any_file_is_read(tmp_path):
    cfg = ActgConfig(generation={"device": "cuda"})
    with pytest.raises(ConfigError, match="field 'generation.device'"):
        stage_generate(cfg, str(tmp_path / "no-run-here"))


def test_generator_on_a_gpu_node_asks_for_cuda_bf16(fake_gpu):
    with pytest.raises(LoaderReached) as err:
        open_generator("tiny-llama", None, GenerationSettings(engine="hf"))
    assert asked_for_gpu_bf16(err.value)


# --- Best-of-N / RL reward: the LM judge ------------------------------------------------------------
@needs_no_gpu
def test_best_of_n_forced_onto_cuda_fails_before_any_file_is_read(tmp_path):
    cfg = ActgConfig(reward={"kind": "lm", "model": "tiny-llama", "device": "cuda"})
    with pytest.raises(ConfigError, match="field 'reward.device'"):
        stage_best_of_n(cfg, str(tmp_path / "no-run-here"))


@needs_no_gpu
def test_lm_judge_auto_scores_on_cpu_fp32():
    judge = build_extractor({"kind": "lm", "model": "tiny-llama", "max_text_tokens": 8}, SCHEMA)
    assert {(p.device.type, p.dtype) for p in judge.model.parameters()} == {("cpu", torch.float32)}
    rows = judge.extract(["mice and neurons"])
    assert rows[0]["topic"] in ("Neuroscience", "Ecology")


def test_lm_judge_on_a_gpu_node_asks_for_cuda_bf16(fake_gpu):
    with pytest.raises(LoaderReached) as err:
        build_extractor({"kind": "lm", "model": "tiny-llama"}, SCHEMA)
    assert asked_for_gpu_bf16(err.value)
