"""A DP hyperparameter sweep on private data (Papernot & Steinke, ICLR 2022) on Ray Tune.

Order matters; everything up to the budget check runs before any trial (and before K is drawn):

1. the ranking metric is private-free, search is random and FIFO (``check_sweep_allowed``);
2. the selection cost is bounded over the whole search space (``tuning.plan.bound_sweep``) and
   refused if over ``privacy.epsilon_budget``;
3. K and the K configurations are drawn from OS entropy; the trials run on Tune under random
   experiment, trial and directory names, silently even with ``DPSYNTH_VERBOSE=1`` (Tune's banner
   and progress would show K), with Tune's result loggers off; each trial is handed its own
   configuration only, and reports only the ranking metric;
4. only the best trial stays: the others, Tune's experiment state and its staging area under
   Ray's session directory are deleted, the best trial's ledger becomes the released ledger with
   the selection event, and its ``release/`` is rebuilt around it (``tuning.release``).

A trial is ranked by a private-free metric that its pipeline writes before any owner-side
evaluation reads held-out rows; a trial whose evaluation fails afterwards still competes with
that score (dropping it would make the selection depend on held-out private data).

``sweep.json`` holds the released trial, its configuration and score, and the selection cost;
never K, the number of failures, or other trials' results. When nothing is released (K = 0, or no
trial produced a score) it says so in words: with Poisson(mu) trials that happens with
probability at least e^(-mu), and it is one of the mechanism's outputs, inside its guarantee.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsynth_core.errors import BudgetExceededError, ConfigError
from dpsynth_core.tuning import draw_num_trials
from dpsynth_core.tuning.plan import Planner, SweepBound, bound_sweep
from dpsynth_core.tuning.release import has_release, release_best, remove_trial
from dpsynth_core.tuning.space import SearchSpace, draw_configurations
from ray_jobs.sweep_trials import TRIAL_PARAMS, SweepConfig, library_space, make_trainable, start_ray, trial_config


def planner_for(pipeline: str) -> Planner:
    """The method's privacy planner: it bounds a trial's cost from its config before any trial runs."""
    from dpsynth_core.actg.sweep_planner import ActgPlanner

    planners: dict[str, Planner] = {"actg": ActgPlanner()}
    if pipeline not in planners:
        raise ConfigError(
            f"refusing a DP sweep of '{pipeline}': no privacy planner bounds its trials' cost before they "
            f"run (planners: {', '.join(planners)}); tune it on a public/proxy data set (privacy.data: public)"
        )
    return planners[pipeline]


@dataclass(frozen=True)
class TrialOutcome:
    params: dict
    run_dir: str | None
    score: float | None  # None: failed or did not report the metric (ranked last)


def plan_private(config: SweepConfig, base: dict, ray_space: dict) -> tuple[SearchSpace, SweepBound]:
    """The library space and its whole-space bound; refused before launch if over the budget."""
    space = library_space(ray_space)
    planner = planner_for(config.pipeline)
    bound = bound_sweep(planner, space, lambda p: trial_config(base, config.overrides, p, Path("planning")),
                        config.privacy, cells_per_interval=config.bound_cells)
    budget = config.privacy.epsilon_budget
    if not bound.epsilon <= budget * (1 + 1e-9):
        raise BudgetExceededError(
            f"refusing the DP sweep before any trial: selecting the best of Poisson/"
            f"{config.privacy.distribution}(mean {config.privacy.mean_trials:g}) trials over the whole search "
            f"space costs epsilon={bound.epsilon:.4f} at delta={bound.delta:g}, over privacy.epsilon_budget="
            f"{budget:g}; lower mean_trials, narrow the space or lower the trials' epsilon"
        )
    return space, bound


def launch_trials(config: SweepConfig, base: dict, drawn: list[dict]) -> list[TrialOutcome]:
    """Run the drawn configurations as Tune trials (FIFO, to completion), silently; their outcomes."""
    from ray import tune

    concurrency = start_ray(config)
    experiment = f"sweep-{secrets.token_hex(6)}"  # Tune's names would otherwise carry trial indices
    tuner = tune.Tuner(
        make_trainable(config, base, (config.output_dir / "trials").resolve(), private=True),
        # each trial gets its own configuration (JSON), never the list of all K
        param_space={TRIAL_PARAMS: tune.grid_search([json.dumps(p) for p in drawn])},
        tune_config=tune.TuneConfig(num_samples=1, max_concurrent_trials=concurrency,
                                    trial_name_creator=_random_name, trial_dirname_creator=_random_name),
        run_config=tune.RunConfig(name=experiment, storage_path=str((config.output_dir / "tune").resolve()),
                                  verbose=0),
    )
    try:
        with silent_tune():
            results = list(tuner.fit())
    finally:
        remove_tune_staging(experiment)
    outcomes = []
    for result in results:
        metrics = result.metrics or {}
        score = metrics.get(config.metric) if result.error is None else None
        score = float(score) if isinstance(score, (int, float)) and math.isfinite(score) else None
        outcomes.append(TrialOutcome(params=json.loads(result.config[TRIAL_PARAMS]), run_dir=metrics.get("run_dir"),
                                     score=score))
    return outcomes


def _random_name(trial) -> str:
    return secrets.token_hex(6)


# Tune's banner ("Number of trials"), heartbeat tables and per-trial log lines all show K.
_TUNE_ENV = {"RAY_AIR_NEW_OUTPUT": "0",  # the legacy reporter prints nothing at verbose=0
             "TUNE_DISABLE_AUTO_CALLBACK_LOGGERS": "1"}  # no result.json / progress.csv / events per trial
_TUNE_LOGGERS = ("ray.tune", "ray.train", "ray.air")


@contextlib.contextmanager
def silent_tune():
    """Tune prints and logs nothing and writes no per-trial result files, even with DPSYNTH_VERBOSE=1."""
    saved_env = {k: os.environ.get(k) for k in _TUNE_ENV}
    saved_levels = {name: logging.getLogger(name).level for name in _TUNE_LOGGERS}
    os.environ.update(_TUNE_ENV)
    for name in _TUNE_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        for name, level in saved_levels.items():
            logging.getLogger(name).setLevel(level)


def remove_tune_staging(experiment: str) -> None:
    """Delete Tune's staging area of ``experiment`` under Ray's session directory (experiment state,
    per-trial folders): it lists every trial."""
    import ray

    if not ray.is_initialized():
        return
    from ray.train.constants import _get_ray_train_session_dir

    for path in Path(_get_ray_train_session_dir()).glob(f"*/{experiment}"):
        shutil.rmtree(path, ignore_errors=True)


def _trial_dirs(config: SweepConfig) -> list[Path]:
    trials = config.output_dir / "trials"
    return [d for d in trials.iterdir() if d.is_dir()] if trials.is_dir() else []


def run_private(config: SweepConfig, base: dict, ray_space: dict) -> dict:
    if (config.output_dir / "sweep.json").exists() or _trial_dirs(config):
        raise ConfigError(f"{config.output_dir}: already holds a sweep; a DP sweep needs a new output_dir "
                          "(one release per directory)")
    space, bound = plan_private(config, base, ray_space)
    privacy = config.privacy
    config.output_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "pipeline": config.pipeline,
        "privacy": {"selection_epsilon": bound.epsilon, "delta": bound.delta, "budget": privacy.epsilon_budget,
                    "mean_trials": privacy.mean_trials, "distribution": privacy.distribution,
                    "bound": "over the whole search space, before launch"},
    }
    k = draw_num_trials(privacy)  # OS entropy; never written, logged or returned
    outcomes = launch_trials(config, base, draw_configurations(space, k)) if k > 0 else []
    try:
        scored = [o for o in outcomes if o.score is not None and o.run_dir and has_release(o.run_dir)]
        if not scored:  # K = 0 (or no trial finished): the mechanism's output is "nothing"
            for run_dir in _trial_dirs(config):
                remove_trial(run_dir)
            summary.update(released=None, message=nothing_released_message(privacy))
        else:
            pick = max if config.mode == "max" else min
            best = pick(scored, key=lambda o: o.score)
            total = release_best(Path(best.run_dir), _trial_dirs(config), bound, privacy.epsilon_budget)
            summary.update(released=best.run_dir, best_config=best.params,
                           best_metric={config.metric: best.score}, released_ledger_epsilon=total)
    finally:
        shutil.rmtree(config.output_dir / "tune", ignore_errors=True)  # Tune's state lists every trial
    (config.output_dir / "sweep.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def nothing_released_message(privacy) -> str:
    """One line a user can read when the selection released nothing (never says why: that is K)."""
    chance = (f" (with Poisson(mu = {privacy.mean_trials:g}) trials, no trial at all has probability "
              f"e^(-mu) = {math.exp(-privacy.mean_trials):.3g})") if privacy.distribution == "poisson" else ""
    return ("nothing was released: the DP selection drew no trial, or no trial produced a score" + chance
            + ". Releasing nothing is one of the mechanism's possible outputs and is covered by its guarantee; "
            "run the sweep again in a new output_dir (it is charged again) or raise mean_trials")
