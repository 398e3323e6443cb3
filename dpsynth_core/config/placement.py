"""Where a stage's model runs and in which precision: one decision, shared by every stage.

``resolve_placement(device, dtype)`` maps the config knobs (``device: auto|cpu|cuda``,
``dtype: auto|bfloat16|float32``, aliases ``bf16``/``fp32``) and what the process can see to a ``Placement``:
- ``auto`` is the GPU when this process has one (a Ray task sees a GPU only when it asked for
  one: Ray sets ``CUDA_VISIBLE_DEVICES`` to "" otherwise), in bf16; else the CPU in fp32;
- ``cuda`` without a visible GPU is a ConfigError, raised here, i.e. before a stage reads data;
- trainable (LoRA) parameters stay fp32 "master weights" under a bf16 base (``place_model``).

On a CPU machine nothing here initialises CUDA: an empty ``CUDA_VISIBLE_DEVICES`` answers
without asking torch, and ``torch.cuda.is_available()`` only queries the driver.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BeforeValidator

from dpsynth_core.config.strict import StrictConfig
from dpsynth_core.errors import ConfigError

DeviceChoice = Literal["auto", "cpu", "cuda"]
DtypeChoice = Literal["auto", "bf16", "fp32"]
# The generation engines spell dtypes as torch/vLLM do; both spellings mean the same placement.
_DTYPE_ALIASES = {"auto": "auto", "bf16": "bf16", "fp32": "fp32", "bfloat16": "bf16", "float32": "fp32",
                  "fp16": "fp16", "float16": "fp16"}
_CONFIG_SPELLING = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16"}


def config_dtype(value):
    """A config's dtype in its one spelling (torch's: ``bfloat16``, ``float32``); ``bf16``/``fp32`` are accepted."""
    return _CONFIG_SPELLING.get(value, value) if isinstance(value, str) else value


def placement_dtype(dtype: str) -> str:
    """The short name a ``Placement`` carries (``bf16``, ``fp32``, ``fp16``) for either spelling."""
    return _DTYPE_ALIASES.get(dtype, dtype)


# Every config's `dtype` field: one spelling, the short aliases accepted (config/placement.py)
Dtype = Annotated[Literal["auto", "float32", "bfloat16"], BeforeValidator(config_dtype)]


class PlacementSettings(StrictConfig):
    """A method's ``placement:`` section: the device and dtype its model stages run on (``resolve`` them
    where the stage runs: a Ray task sees a GPU only when it asked for one)."""

    device: DeviceChoice = "auto"
    dtype: Dtype = "auto"  # auto: bfloat16 on a GPU, float32 on CPU; LoRA weights stay fp32

    def resolve(self, *, local_rank: int = 0) -> Placement:
        return resolve_placement(self.device, self.dtype, local_rank=local_rank, section="placement.")

    def under(self, stage: dict) -> dict:
        """A stage's ``device``/``dtype`` (a config mapping) with what it leaves ``auto`` taken from this
        placement: a method's stages (ACTG) or PLMs (WASP, Aug-PE) may each override the method's placement."""
        mine = {k: getattr(self, k) for k in ("device", "dtype") if getattr(self, k) != "auto"}
        return {**stage, **{k: v for k, v in mine.items() if stage.get(k, "auto") == "auto"}}


def gpu_visible() -> bool:
    """True when this process can use a CUDA GPU (Ray hides GPUs from tasks that asked for none)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    import torch

    return torch.cuda.is_available()


@dataclass(frozen=True)
class Placement:
    """A stage's device ("cpu" or "cuda") with its index, and the dtype of frozen weights."""

    device: str
    dtype: str  # "bf16" | "fp32" | "fp16" (Serve replicas may ask for fp16)
    index: int = 0

    @property
    def on_gpu(self) -> bool:
        return self.device == "cuda"

    def torch_device(self):
        import torch

        return torch.device("cuda", self.index) if self.on_gpu else torch.device("cpu")

    def torch_dtype(self):
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.dtype, torch.float32)


def resolve_placement(device: DeviceChoice = "auto", dtype: DtypeChoice = "auto", *, local_rank: int = 0,
                      section: str = "") -> Placement:
    """The placement a stage uses; ``cuda`` on a machine without a visible GPU is a ConfigError.
    ``section`` (e.g. ``"rl."``) prefixes the field names in errors, so they point at the stage."""
    if device not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"field '{section}device': expected auto, cpu or cuda, got {device!r}")
    if dtype not in _DTYPE_ALIASES:
        raise ConfigError(f"field '{section}dtype': expected auto, bf16 or fp32, got {dtype!r}")
    dtype = _DTYPE_ALIASES[dtype]
    if device == "cuda" and not gpu_visible():
        raise ConfigError(
            f"field '{section}device': 'cuda' requested but this process sees no GPU (no CUDA build of torch, no "
            "driver, or a Ray task that requested no GPU); use device: auto or cpu"
        )
    on_gpu = device == "cuda" or (device == "auto" and gpu_visible())
    chosen = "cuda" if on_gpu else "cpu"
    if dtype == "auto":
        dtype = "bf16" if on_gpu else "fp32"  # CPU bf16 is slower than fp32 for most kernels here
    return Placement(chosen, dtype, local_rank if on_gpu else 0)


def place_model(model, placement: Placement):
    """Move ``model`` to the placement: frozen weights in its dtype, trainable ones in fp32
    (optimizer updates of LoRA weights are too small for bf16's 8-bit mantissa)."""
    import torch

    model.to(device=placement.torch_device(), dtype=placement.torch_dtype())
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    return model


def ray_num_gpus(device: DeviceChoice, cluster_gpus: float) -> float:
    """GPUs a stage's Ray task must request so that ``auto`` can see one (Ray hides the rest)."""
    if device == "cpu":
        return 0.0
    if device == "cuda":
        return 1.0
    return 1.0 if cluster_gpus >= 1 else 0.0


def apply_torch_threads(configured: int | None) -> int:
    """Set torch's intra-op threads: ``configured`` when given, else the CPUs this process was given.

    Ray sets ``OMP_NUM_THREADS`` to a task's ``num_cpus`` on every task, but torch reads it only once, at
    import, and a reused worker keeps the count of the task that imported torch first: so it is read again
    here. Without either, torch keeps its own default (the machine's cores). Returns the count in use."""
    import torch

    threads = configured
    if threads is None:
        given = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(given) if given.isdigit() and int(given) > 0 else None
    if threads is not None and threads != torch.get_num_threads():
        torch.set_num_threads(threads)
    return torch.get_num_threads()
