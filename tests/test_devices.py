"""Device placement (issue 15.1): auto -> CPU fp32 here, cuda without a GPU fails before the data is
read, LoRA master weights stay fp32 under a bf16 base, and the CPU path never initialises CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from dpsynth_core.config.placement import place_model, ray_num_gpus, resolve_placement
from dpsynth_core.dpsgd.config import DpSgdConfig, TrainExample
from dpsynth_core.dpsgd.engine import build_lora_model
from dpsynth_core.errors import ConfigError

needs_no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")


@needs_no_gpu
def test_auto_is_cpu_fp32_and_explicit_bf16_is_honoured():
    auto = resolve_placement("auto", "auto")
    assert (auto.device, auto.dtype, auto.torch_dtype()) == ("cpu", "fp32", torch.float32)
    assert resolve_placement("cpu", "bf16").torch_dtype() == torch.bfloat16


def test_hidden_gpu_means_cpu_even_where_torch_sees_one(monkeypatch):
    # Ray sets CUDA_VISIBLE_DEVICES="" for a task that requested no GPU
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert resolve_placement("auto").device == "cpu"
    with pytest.raises(ConfigError, match="'cuda' requested"):
        resolve_placement("cuda")


@needs_no_gpu
def test_cuda_without_gpu_fails_before_any_private_data_is_read(tmp_path):
    from dpsynth_core.dpsgd.trainer import train_dp_lora

    class Source:
        loaded = False

        def load(self):
            Source.loaded = True
            return [TrainExample("p", "t")] * 8

        def describe(self):
            return "a test source"

    cfg = DpSgdConfig(model="tiny-llama", epsilon=1.0, delta=1e-3, steps=1, device="cuda")
    with pytest.raises(ConfigError, match="field 'device'"):
        train_dp_lora(Source(), cfg, output_dir=tmp_path / "out", progress=False)
    assert not Source.loaded
    assert not (tmp_path / "out").exists()


def test_lora_params_stay_fp32_under_a_bf16_base():
    cfg = DpSgdConfig(model="tiny-llama", epsilon=1.0, steps=1, device="cpu", dtype="bf16",
                      lora={"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]})
    model, _ = build_lora_model(cfg, torch.device("cpu"))
    trainable = {n: p.dtype for n, p in model.named_parameters() if p.requires_grad}
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert trainable and set(trainable.values()) == {torch.float32}
    assert all("lora_" in n for n in trainable)
    assert frozen == {torch.bfloat16}
    # a forward/backward in mixed precision runs and reaches the fp32 LoRA weights
    ids = torch.randint(0, 100, (2, 8))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.float32 for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)


def test_place_model_keeps_trainable_fp32():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    model[0].requires_grad_(False)
    place_model(model, resolve_placement("cpu", "bf16"))
    assert model[0].weight.dtype == torch.bfloat16 and model[1].weight.dtype == torch.float32


def test_ray_gpu_request_follows_the_knob():
    assert ray_num_gpus("auto", 0) == 0 and ray_num_gpus("auto", 2) == 1
    assert ray_num_gpus("cpu", 4) == 0 and ray_num_gpus("cuda", 0) == 1


@needs_no_gpu
def test_cpu_placement_does_not_initialise_cuda():
    code = (
        "import torch\n"
        "from dpsynth_core.config.placement import resolve_placement, place_model\n"
        "p = resolve_placement('auto', 'auto')\n"
        "place_model(torch.nn.Linear(2, 2), p)\n"
        "assert p.device == 'cpu' and not torch.cuda.is_initialized()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_torch_threads_follow_the_cpus_a_stage_was_given_unless_configured():
    """torch_threads: null (the default) takes OMP_NUM_THREADS, which Ray sets per task but torch reads only
    at import: a reused worker's second task must not keep the first task's count. In a fresh process: an
    engine run in this one (vLLM's CPU worker pins its threads) leaves torch's count fixed."""
    script = (
        "import os, torch\n"
        "from dpsynth_core.config.placement import apply_torch_threads\n"
        "torch.set_num_threads(2)\n"
        "os.environ['OMP_NUM_THREADS'] = '1'\n"  # the next task was given one CPU
        "print(apply_torch_threads(None), torch.get_num_threads(), apply_torch_threads(2))\n"  # configured wins
        "del os.environ['OMP_NUM_THREADS']\n"
        "print(apply_torch_threads(None))\n"  # nothing given: left as it is
        "os.environ['OMP_NUM_THREADS'] = 'x'\n"
        "print(apply_torch_threads(None))\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["1 1 2", "2", "2"], done.stdout
