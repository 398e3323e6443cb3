"""Issue 15.1: a Ray driver asks for a GPU for every stage whose config forces ``device: cuda``
(Ray hides GPUs from a task that asks for none: the stage would refuse to start)."""

from __future__ import annotations

from dpsynth_core.actg.pipeline import ActgConfig
from dpsynth_core.tabular.config import DpFairConfig


def test_actg_driver_asks_for_a_gpu_where_a_stage_forces_cuda():
    from ray_jobs.actg import stage_resources

    cfg = ActgConfig(generation={"device": "cuda"}, rl={"device": "cuda"}, generator={"steps": 1, "device": "cuda"},
                     reward={"kind": "lm", "model": "tiny-llama", "device": "cuda"})
    for stage in ("private", "generate", "best_of_n", "anchored_rl", "synthesize"):
        assert stage_resources(cfg, stage).gpus == 1, stage
    assert not stage_resources(cfg, "evaluate").gpus  # no model of its own: stays on CPU
    assert not stage_resources(ActgConfig(), "generate").gpus  # auto asks for nothing by itself
    explicit = ActgConfig(generation={"device": "cuda"}, resources={"stages": {"generate": {"gpus": 2}}})
    assert stage_resources(explicit, "generate").gpus == 2


def test_dpfair_driver_asks_for_a_gpu_where_training_or_generation_forces_cuda():
    from ray_jobs.dpfair import model_stage_resources

    base = {"schema_path": "configs/schemas/adult.yaml", "columns": ["age", "sex", "income"], "epsilon": 1.0}
    assert model_stage_resources(DpFairConfig.model_validate(base)).gpus == 0
    for section in ("training", "generation"):
        cfg = DpFairConfig.model_validate({**base, section: {"device": "cuda"}})
        assert model_stage_resources(cfg).gpus == 1
