"""The WASP / Aug-PE driver shared by ``ray_jobs.wasp`` and ``ray_jobs.augpe``.

Joins the cluster or embeds a local Ray when a PLM needs one (``pe_backends.make_llms``), keeps
an object-store run directory in step with its bucket (``dpsynth_core.runs.storage_sync``: pulled
before, pushed after every iteration and at the end; the ledger and each noisy vote are uploaded
the moment they are written), and records where the run ran: ``RUN_DIR/ran_on.json`` lists, per
submission, the driver's node (the vote loop: embeddings, DP votes, ledger) and each PLM's node and
GPU ids.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from dpsynth_core.pe.callbacks import Callback
from dpsynth_core.pe.checkpoint import RunState
from dpsynth_core.pe.config import PEConfig
from dpsynth_core.pe.pipeline import load_pe_config, run_pe_method
from dpsynth_core.runs.files import atomic_write_text
from dpsynth_core.runs.storage import require_durable_run_dir
from dpsynth_core.runs.storage_sync import RunMirror, synced_run
from ray_jobs.pe_backends import make_llms, placement_of

RAN_ON_FILE = "ran_on.json"


class PushEachIteration(Callback):
    """After every checkpoint: the iteration's outputs to the bucket, ``checkpoints/latest`` last."""

    def __init__(self, mirror: RunMirror) -> None:
        self.mirror = mirror

    def on_iteration_end(self, state: RunState) -> None:
        self.mirror.push()


def _driver_node() -> dict:
    """This process's Ray node (None when every PLM ran in-process and Ray was never started) and host."""
    import ray

    node = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    return {"node_id": node, "host": socket.gethostname()}


def record_ran_on(run_dir: Path, plms: list[dict]) -> None:
    """Append this submission's placement (node ids only: nothing private) to ``ran_on.json``."""
    path = Path(run_dir) / RAN_ON_FILE
    attempts = json.loads(path.read_text(encoding="utf-8"))["attempts"] if path.is_file() else []
    attempts.append({"at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     "vote_loop": _driver_node(), "plms": plms})
    atomic_write_text(path, json.dumps({"attempts": attempts}, indent=2))


def run_pe(config_path: Path, method: str, resume: bool = True, llm_factory=make_llms,
           callbacks: Sequence[Callback] = ()) -> Path:
    """Run (or resume) ``method`` from ``config_path``; returns the run directory."""
    return run_on_ray(load_pe_config(config_path, method), resume, llm_factory, callbacks)


def run_on_ray(cfg: PEConfig, resume: bool = True, llm_factory=make_llms, callbacks: Sequence[Callback] = ()) -> Path:
    """Run (or resume) a WASP / Aug-PE config, its PLMs placed by ``llm_factory``; returns the run directory."""
    import ray

    # a submitted job must write to shared storage, not to its temporary working directory
    run_dir = require_durable_run_dir(cfg.run_dir)
    placed: list[dict] = []

    def factory(plms):
        llms = llm_factory(plms)
        placed.extend(placement_of(llm) for llm in llms)
        return llms

    started = not ray.is_initialized()
    try:
        with synced_run(run_dir, resume=resume) as mirror:
            cbs = [*callbacks, *([PushEachIteration(mirror)] if mirror else [])]
            out = run_pe_method(cfg, factory, resume=resume, callbacks=cbs)
            record_ran_on(out, placed)
        return out
    finally:
        if started and ray.is_initialized():
            ray.shutdown()
