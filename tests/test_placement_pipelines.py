"""Issue 15.1, WASP / Aug-PE PLMs and DPFairLLM: each stage that runs a model takes ``device``/``dtype``,
resolves it through ``dpsynth_core.config.placement`` before the private data is read, and asks Ray for a GPU
when its config says ``cuda``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError

from dpsynth_core.errors import ConfigError
from tests.placement_probe import LoaderReached, asked_for_gpu_bf16, fake_gpu  # noqa: F401

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
REPO = Path(__file__).resolve().parents[1]


def _unreadable(tmp_path: Path) -> Path:
    path = tmp_path / "private.csv"
    path.write_text('"unterminated\n')  # reading it would be a DataError, not a device error
    return path


# --- WASP / Aug-PE PLMs ----------------------------------------------------------------------------
@needs_no_gpu
def test_pe_plm_forced_onto_cuda_fails_before_the_private_data_is_read(tmp_path):
    from dpsynth_core.pe.pipeline import run_pipeline

    cfg = {"method": "wasp", "run_dir": str(tmp_path / "run"),
           "data": {"source": "file", "path": str(_unreadable(tmp_path)), "classes": ["a", "b"], "num_private": 4},
           "plms": [{"model": "tiny-llama", "backend": "hf", "device": "cuda"}], "epsilon": 1.0, "evaluate": False}
    path = tmp_path / "wasp.yaml"
    path.write_text(yaml.safe_dump(cfg))

    def no_llms(_):
        raise AssertionError("the PLMs were built before the placement was checked")

    with pytest.raises(ConfigError, match=r"field 'plms\[0\].device': 'cuda' requested"):
        run_pipeline(path, "wasp", no_llms)


def test_pe_ray_plm_with_device_cuda_asks_ray_for_a_gpu():
    from dpsynth_core.pe.config import PLMConfig
    from ray_jobs.pe_backends import plm_resources

    assert plm_resources(PLMConfig(device="cuda")).gpus == 1
    assert plm_resources(PLMConfig()).gpus == 0
    with pytest.raises(ValidationError, match="resources.gpus 0"):
        PLMConfig(device="cuda", resources={"gpus": 0})


def test_pe_plm_on_a_gpu_node_asks_for_cuda_bf16(fake_gpu):
    from dpsynth_core.pe.llm import LocalLLM

    with pytest.raises(LoaderReached) as err:
        LocalLLM("tiny-llama", engine="hf")
    assert asked_for_gpu_bf16(err.value)


# --- DPFairLLM ---------------------------------------------------------------------------------------
def _dpfair(tmp_path: Path, **sections):
    from dpsynth_core.tabular.config import DpFairConfig

    raw = yaml.safe_load((REPO / "configs/dpfair_tiny_test.yaml").read_text())
    raw.update(output_dir=str(tmp_path / "run"), schema_path=str(REPO / raw["schema_path"]),
               data={"source": str(_unreadable(tmp_path)), "holdout_rows": 10})
    for key, extra in sections.items():
        raw[key] = {**raw.get(key, {}), **extra}
    return DpFairConfig.model_validate(raw)


@needs_no_gpu
@pytest.mark.parametrize("section", ["training", "generation"])
def test_dpfair_model_stage_forced_onto_cuda_fails_before_the_private_rows_are_read(tmp_path, section):
    from dpsynth_core.tabular.stages_model import stage_model

    cfg = _dpfair(tmp_path, **{section: {"device": "cuda"}})
    (tmp_path / "run").mkdir()
    with pytest.raises(ConfigError, match=r"field 'placement.device': 'cuda' requested"):  # was {section}.device
        stage_model(cfg, str(tmp_path / "run"))


def test_dpfair_public_stage_on_a_gpu_node_asks_for_cuda_bf16(tmp_path, fake_gpu):
    from dpsynth_core.tabular.run_schema import public_schema
    from dpsynth_core.tabular.stages_model import _public_stage

    cfg = _dpfair(tmp_path, training={"public_stage": {"steps": 1}})
    (tmp_path / "run").mkdir()
    with pytest.raises(LoaderReached) as err:
        _public_stage(cfg, tmp_path / "run", public_schema(cfg))
    assert asked_for_gpu_bf16(err.value)


def test_dpfair_generation_on_a_gpu_node_asks_for_cuda_bf16(tmp_path, fake_gpu):
    from dpsynth_core.tabular.stages_model import _generate

    from dpsynth_core.privacy import PrivacyLedger

    cfg = _dpfair(tmp_path)
    PrivacyLedger.create(tmp_path, "adult", 1.0, 1e-5)
    with pytest.raises(LoaderReached) as err:
        _generate(cfg, tmp_path, None, None, "tiny-llama")
    assert asked_for_gpu_bf16(err.value)


def test_dpfair_engine_generator_takes_the_generation_device(fake_gpu):
    from dpsynth_core.config.placement import PlacementSettings
    from dpsynth_core.tabular.config import GenerationSettings
    from dpsynth_core.tabular.generation import open_row_generator

    with pytest.raises(LoaderReached) as err:
        open_row_generator("tiny-llama", None, GenerationSettings(), engine="hf")
    assert asked_for_gpu_bf16(err.value)
    with pytest.raises(LoaderReached) as err:
        open_row_generator("tiny-llama", None, GenerationSettings(), engine="hf",
                           placement=PlacementSettings(device="cpu"))
    assert err.value.placement.device == "cpu"
