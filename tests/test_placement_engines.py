"""Issue 15.1, generation side: the engines (HF and vLLM's device choice), Serve replicas and the
Ray Data batch generator take ``device``/``dtype`` and go through ``dpsynth_core.config.placement``."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from dpsynth_core.engines import EngineConfig, SamplingParams, load_engine, resolve_backend
from dpsynth_core.errors import ConfigError
from tests.placement_probe import LoaderReached, asked_for_gpu_bf16, fake_gpu, save_tiny_adapter  # noqa: F401

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


def _placement_of(model) -> set[tuple[str, torch.dtype]]:
    return {(p.device.type, p.dtype) for p in model.parameters()}


@needs_no_gpu
def test_hf_engine_auto_is_cpu_fp32_with_the_adapter(tmp_path):
    adapter = save_tiny_adapter(tmp_path / "adapter")
    with load_engine(EngineConfig(model="tiny-llama", adapter_dir=adapter, backend="hf")) as engine:
        assert (engine.placement.device, engine.placement.dtype) == ("cpu", "fp32")
        assert _placement_of(engine.model) == {("cpu", torch.float32)}
        out = engine.generate(["a"], SamplingParams(max_new_tokens=2, seed=1))
        assert len(out) == 1


def test_hf_engine_honours_a_forced_bf16():
    with load_engine(EngineConfig(model="tiny-llama", backend="hf", device="cpu", dtype="bfloat16")) as engine:
        assert _placement_of(engine.model) == {("cpu", torch.bfloat16)}


@needs_no_gpu
@pytest.mark.parametrize("backend", ["hf", "auto", "vllm"])
def test_engine_forced_onto_cuda_without_a_gpu_is_a_config_error(backend):
    with pytest.raises(ConfigError, match="field 'device': 'cuda' requested"):
        load_engine(EngineConfig(model="tiny-llama", backend=backend, device="cuda"))


def test_engine_on_a_gpu_node_asks_the_loader_for_cuda_bf16(fake_gpu, tmp_path):
    with pytest.raises(LoaderReached) as err:
        load_engine(EngineConfig(model="tiny-llama", backend="hf"))
    assert asked_for_gpu_bf16(err.value)
    with pytest.raises(LoaderReached) as err:  # a config can still keep it on the CPU
        load_engine(EngineConfig(model="tiny-llama", backend="hf", device="cpu"))
    assert (err.value.placement.device, err.value.placement.dtype) == ("cpu", "fp32")


def test_vllm_runs_where_its_build_runs_so_a_cpu_placement_on_a_gpu_node_is_hf(fake_gpu):
    # a CUDA vLLM cannot run on the CPU: auto falls back to HF, an explicit vllm says why
    assert resolve_backend(EngineConfig(model="tiny-llama", device="cpu")) == "hf"
    with pytest.raises(ConfigError, match="places the model on cpu but vLLM here runs on cuda"):
        resolve_backend(EngineConfig(model="tiny-llama", backend="vllm", device="cpu"))


# --- Serve replicas -------------------------------------------------------------------------------
def test_serve_replica_with_device_cuda_must_ask_ray_for_a_gpu():
    from serving.app import _generator_options
    from serving.config import ModelDeploymentConfig

    with pytest.raises(ValidationError, match="device 'cuda' needs num_gpus > 0"):
        ModelDeploymentConfig(name="m", model="tiny-llama", device="cuda")
    gpu = ModelDeploymentConfig(name="m", model="tiny-llama", device="cuda", num_gpus=1)
    assert _generator_options(gpu, 1)["ray_actor_options"]["num_gpus"] == 1


@needs_no_gpu
def test_serve_hf_replica_placement():
    from serving.hf_backend import HFBackend
    from serving.schemas import SequenceJob

    with pytest.raises(ConfigError, match="field 'device'"):
        HFBackend("tiny-llama", device="cuda")
    backend = HFBackend("tiny-llama", torch_threads=1)
    assert _placement_of(backend.model) == {("cpu", torch.float32)}
    out = backend.generate([SequenceJob("a b", max_new_tokens=3, temperature=1.0, top_p=1.0, seed=3)])
    assert out[0].completion_tokens >= 1


def test_serve_hf_replica_on_a_gpu_node_asks_for_cuda_bf16(fake_gpu):
    from serving.hf_backend import HFBackend

    with pytest.raises(LoaderReached) as err:
        HFBackend("tiny-llama", torch_threads=1)
    assert asked_for_gpu_bf16(err.value)


# --- Ray Data batch generation --------------------------------------------------------------------
def test_batch_generator_device_reaches_its_engine():
    from ray_jobs.batch_generate import BatchGenerateConfig, GeneratorActor

    with pytest.raises(ValidationError, match="gpus_per_actor"):
        BatchGenerateConfig(model="tiny-llama", prompt="a", device="cuda")
    cfg = BatchGenerateConfig(model="tiny-llama", prompt="a", device="cuda", gpus_per_actor=1, engine="hf")
    assert cfg.engine_config().device == "cuda"
    if not torch.cuda.is_available():  # the actor itself refuses a device it cannot see
        with pytest.raises(ConfigError, match="field 'device'"):
            GeneratorActor(cfg.model_dump(mode="json"))


def test_batch_generator_actor_on_a_gpu_node_asks_for_cuda_bf16(fake_gpu):
    from ray_jobs.batch_generate import BatchGenerateConfig, GeneratorActor

    cfg = BatchGenerateConfig(model="tiny-llama", prompt="a", engine="hf", gpus_per_actor=1)
    with pytest.raises(LoaderReached) as err:
        GeneratorActor(cfg.model_dump(mode="json"))
    assert asked_for_gpu_bf16(err.value)
