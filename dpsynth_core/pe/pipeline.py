"""End-to-end WASP / Aug-PE run (Ray-free): one resumable stage (``pe.stage``) on the run loop
(``run_loop``: lock, rerun rule, ledger, release, summary).

The drivers in ``ray_jobs/`` pass a ``make_llms`` factory (Ray actors, Serve handles, ...);
this module never imports Ray.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from pathlib import Path

from dpsynth_core.config import load_config
from dpsynth_core.errors import ConfigError
from dpsynth_core.pe.callbacks import Callback
from dpsynth_core.pe.config import PEConfig
from dpsynth_core.pe.stage import LLMFactory, check_plm_placements, execute, make_runner, plan_votes, stage_evolve
from dpsynth_core.run_loop import open_run_ledger, run_method
from dpsynth_core.run_loop.ledger import resolve_delta as delta_of_plan
from dpsynth_core.runs import open_run_dir
from dpsynth_core.runs.contract import Method, PrivacyPlan, Stage

__all__ = ["LLMFactory", "PEMethod", "execute", "load_pe_config", "make_runner", "open_ledger", "prepare_run_dir",
           "resolve_delta", "run_pe_method", "run_pipeline"]


def load_pe_config(path: str | Path, method: str) -> PEConfig:
    cfg = load_config(path, PEConfig)
    if cfg.method != method:
        raise ConfigError(f"{path}: field 'method' is '{cfg.method}' but this driver runs '{method}'")
    return cfg


def privacy_plan(cfg: PEConfig) -> PrivacyPlan:
    """M = data.num_private (public); delta unset: the shared default rule; ``"1/(M ln M)"``: that
    formula, by name (m * delta = 1/ln M: a weak guarantee); either below 1/M."""
    m = cfg.data.num_private
    delta = 1.0 / (m * math.log(m)) if cfg.delta == "1/(M ln M)" else cfg.delta
    return PrivacyPlan(cfg.dataset_name, cfg.epsilon, delta, m)


def resolve_delta(cfg: PEConfig) -> float:
    """The run's delta (checked against M), as its ledger will state it."""
    return delta_of_plan(privacy_plan(cfg))


class PEMethod(Method):
    """WASP or Aug-PE: one stage, named after the method, that checkpoints every iteration."""

    def __init__(self, config: PEConfig, make_llms: LLMFactory, callbacks: Sequence[Callback] = ()) -> None:
        super().__init__(config)
        self.kind = config.method
        self.make_llms, self.callbacks = make_llms, callbacks

    def stages(self) -> list[Stage]:
        fn = functools.update_wrapper(functools.partial(stage_evolve, make_llms=self.make_llms,
                                                        callbacks=self.callbacks), stage_evolve)
        return [Stage(self.config.method, fn, records=("gaussian", "post_processing"), reads_private=True,
                      plan=plan_votes)]

    def run_dir(self) -> Path:
        return Path(self.config.run_dir)

    def privacy_plan(self) -> PrivacyPlan:
        check_plm_placements(self.config.plms)  # a forced device this process cannot see fails before the data is read
        plan = privacy_plan(self.config)
        delta_of_plan(plan)
        return plan

    def release_items(self, root: Path) -> dict[str, Path]:
        plot = root / "plm_weights.png"  # from noisy votes only: post-processing
        return {"synthetic.jsonl": root / "synthetic.jsonl", **({plot.name: plot} if plot.is_file() else {})}


def prepare_run_dir(cfg: PEConfig, resume: bool) -> Path:
    """``cfg.run_dir`` under the rerun rule of ``runs/run_dir.py``, as the run loop opens it."""
    return open_run_dir(Path(cfg.run_dir), cfg.model_dump(mode="json"), resume=resume, moved=PEConfig.moved_keys)


def open_ledger(cfg: PEConfig, run_dir: Path):
    """The run's ledger, as the run loop opens it (a reference run's is marked not private)."""
    return open_run_ledger(Path(run_dir), privacy_plan(cfg), cfg.method)


def run_pipeline(config_path: str | Path, method: str, make_llms: LLMFactory, resume: bool = True,
                 callbacks: Sequence[Callback] = ()) -> Path:
    """Everything a driver does; returns the run directory (synthetic.jsonl, metrics.json,
    ledger.sqlite, checkpoints/, metrics.jsonl, plm_weights.png, release/)."""
    return run_pe_method(load_pe_config(config_path, method), make_llms, resume=resume, callbacks=callbacks)


def run_pe_method(cfg: PEConfig, make_llms: LLMFactory, resume: bool = True, callbacks: Sequence[Callback] = ()) -> Path:
    """:func:`run_pipeline` on a loaded config."""
    return run_method(PEMethod(cfg, make_llms, callbacks), resume=resume).run_dir
