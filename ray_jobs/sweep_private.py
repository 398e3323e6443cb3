"""A DP hyperparameter sweep on private data (Papernot & Steinke, ICLR 2022) on Ray Tune.

Order matters; everything up to the budget check runs before any trial (and before K is drawn):

1. the ranking metric is private-free, search is random and FIFO (``check_sweep_allowed``);
2. the selection cost is bounded over the whole search space (``tuning_plan.bound_sweep``) and
   refused if over ``privacy.epsilon_budget``;
3. K and the K configurations are drawn from OS entropy; the trials run on Tune under random
   directory names, silently (Tune's progress would show K);
4. only the best trial stays: the others and Tune's experiment state are deleted, and the best
   trial's ledger becomes the released ledger with the selection event (``tuning_release``).

``sweep.json`` holds the released trial, its configuration and score, and the selection cost;
never K, the number of failures, or other trials' results.
"""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpsynth_core.errors import BudgetExceededError
from dpsynth_core.tuning import draw_num_trials
from dpsynth_core.tuning_plan import SweepBound, bound_sweep, planner_for
from dpsynth_core.tuning_release import release_best, remove_trial
from dpsynth_core.tuning_space import SearchSpace, draw_configurations
from ray_jobs.sweep import TRIAL_INDEX, SweepConfig, library_space, make_trainable, start_ray, trial_config


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
    """Run the drawn configurations as Tune trials (FIFO, to completion); their outcomes."""
    from ray import tune

    concurrency = start_ray(config)
    tuner = tune.Tuner(
        make_trainable(config, base, (config.output_dir / "trials").resolve(), drawn=drawn),
        param_space={TRIAL_INDEX: tune.grid_search(list(range(len(drawn))))},
        tune_config=tune.TuneConfig(num_samples=1, max_concurrent_trials=concurrency),
        run_config=tune.RunConfig(name="sweep", storage_path=str((config.output_dir / "tune").resolve()), verbose=0),
    )
    outcomes = []
    for result in tuner.fit():
        metrics = result.metrics or {}
        score = metrics.get(config.metric) if result.error is None else None
        score = float(score) if isinstance(score, (int, float)) and math.isfinite(score) else None
        outcomes.append(TrialOutcome(params=drawn[result.config[TRIAL_INDEX]], run_dir=metrics.get("run_dir"),
                                     score=score))
    return outcomes


def _trial_dirs(config: SweepConfig) -> list[Path]:
    trials = config.output_dir / "trials"
    return [d for d in trials.iterdir() if d.is_dir()] if trials.is_dir() else []


def run_private(config: SweepConfig, base: dict, ray_space: dict) -> dict:
    if (config.output_dir / "sweep.json").exists() or _trial_dirs(config):
        from dpsynth_core.errors import ConfigError

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
        scored = [o for o in outcomes if o.score is not None and o.run_dir]
        if not scored:  # K = 0 (or no trial finished): the mechanism's output is "nothing"
            for run_dir in _trial_dirs(config):
                remove_trial(run_dir)
            summary["released"] = None
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
