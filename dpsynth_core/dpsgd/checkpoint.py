"""Training checkpoints: adapter, optimizer, step/accounting state and sampler seed, written atomically.

The sampler is counter-based (see ``sampling.py``): its whole RNG state is (seed, step), both
stored here, so a resumed run draws exactly the batches an uninterrupted run would have drawn.
A checkpoint holds the secret sampling seed: it is private state, like the data, never an output,
and it is deleted once it can no longer be resumed (training finished, a fresh restart, a refused
resume).

The identity of a checkpoint includes the privacy plan (sigma, q, delta, accountant, steps, n):
the ledger records ONE event for all steps at the plan's sigma, so resuming steps that ran under
another sigma (the ledger changed between crash and resume, and the plan with it) would
under-report epsilon. Such a resume is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dpsynth_core.dpsgd.config import DpSgdConfig
from dpsynth_core.errors import ConfigError

if TYPE_CHECKING:
    from dpsynth_core.dpsgd.budget import PrivacyPlan

ADAPTER_FILE = "adapter.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
STATE_FILE = "train_state.json"
# Fields that may change between an interrupted run and its resumption without changing the result.
_RESUME_FREE_FIELDS = {"stop_after_steps", "checkpoint_every", "num_workers", "torch_threads", "device", "merge_adapter"}


_PLAN_FIELDS = ("noise_multiplier", "sampling_rate", "delta", "accountant", "steps", "n_units")


def config_fingerprint(config: DpSgdConfig, plan: PrivacyPlan) -> str:
    """Hash of everything that determines the training trajectory and the privacy accounting:
    the config and the privacy plan (sigma, q, delta, accountant, steps, n), exact floats."""
    data = config.model_dump(mode="json", exclude=_RESUME_FREE_FIELDS)
    data["plan"] = {k: getattr(plan, k) for k in _PLAN_FIELDS}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def check_resumable(state: TrainState, plan: PrivacyPlan, fingerprint: str, where: Path) -> None:
    """ConfigError unless the checkpoint's steps ran under exactly this plan and config.

    The message names the privacy fields that differ (public figures: sigma, q, delta)."""
    if state.fingerprint == fingerprint:
        return
    stored = {"noise_multiplier": state.noise_multiplier, "sampling_rate": state.sampling_rate,
              "delta": state.delta, "accountant": state.accountant}
    changed = [f"{k} {v!r} -> {getattr(plan, k)!r}" for k, v in stored.items()
               if v is not None and v != getattr(plan, k)]
    why = ("its privacy plan differs (" + "; ".join(changed) + "): recording one event for all steps at the "
           "new plan would misstate epsilon (did the ledger change since the crash?)") if changed else \
        "it was made with a different training config (or data)"
    raise ConfigError(
        f"{where}: cannot resume this DP-SGD checkpoint: {why}. The checkpoint (which holds the secret "
        "sampling seed) was deleted; run again to train from scratch under the current plan"
    )


@dataclass
class TrainState:
    """Accounting/step state that travels with a checkpoint (no private values)."""

    step: int
    sampling_seed: int
    noise_multiplier: float
    sampling_rate: float
    delta: float
    fingerprint: str
    history: list[dict] = field(default_factory=list)  # step, loss, epsilon (no batch sizes: private)
    accountant: str | None = None  # None in checkpoints written before it was stored

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1)

    @classmethod
    def from_json(cls, text: str) -> TrainState:
        return cls(**json.loads(text))


def write_checkpoint_files(directory: Path, adapter_state: dict, optimizer_state: dict, state: TrainState) -> None:
    """Write the three checkpoint files into an existing (fresh) directory."""
    from safetensors.torch import save_file

    directory = Path(directory)
    save_file(adapter_state, str(directory / ADAPTER_FILE))
    torch.save(optimizer_state, directory / OPTIMIZER_FILE)
    (directory / STATE_FILE).write_text(state.to_json(), encoding="utf-8")


def save_checkpoint(directory: Path, adapter_state: dict, optimizer_state: dict, state: TrainState) -> Path:
    """Atomically replace ``directory`` with a new checkpoint (never a half-written one)."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-", dir=directory.parent))
    try:
        write_checkpoint_files(staging, adapter_state, optimizer_state, state)
        old = None
        if directory.exists():
            old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
            os.replace(directory, old)
        os.replace(staging, directory)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return directory


def discard_checkpoint(directory: Path) -> None:
    """Delete a checkpoint directory and any half-written sibling of it (each may hold the secret
    seed); no error when absent."""
    directory = Path(directory)
    shutil.rmtree(directory, ignore_errors=True)
    if directory.parent.is_dir():
        for leftover in directory.parent.glob(f".{directory.name}.*-*"):  # save_checkpoint's staging / old dirs
            shutil.rmtree(leftover, ignore_errors=True)


def is_checkpoint(directory: Path) -> bool:
    d = Path(directory)
    return all((d / f).is_file() for f in (ADAPTER_FILE, OPTIMIZER_FILE, STATE_FILE))


def load_checkpoint(directory: Path) -> tuple[dict, dict, TrainState]:
    from safetensors.torch import load_file

    d = Path(directory)
    adapter = load_file(str(d / ADAPTER_FILE))
    optimizer = torch.load(d / OPTIMIZER_FILE, map_location="cpu", weights_only=False)
    state = TrainState.from_json((d / STATE_FILE).read_text(encoding="utf-8"))
    return adapter, optimizer, state
