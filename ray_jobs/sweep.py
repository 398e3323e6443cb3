"""Privacy-aware hyperparameter sweeps on Ray Tune.

    dpsynth tune --config configs/sweep_actg_tiny.yaml

Each trial is a driver function that writes the trial's pipeline config (the base config plus
the sampled overrides) and runs the pipeline's stages (``ray_jobs/<pipeline>.main``), then
reports the pipeline's ``metrics.json``. Privacy (see ``dpsynth_core.tuning``):

* ``privacy.data: public`` -- any search (random, Optuna) and scheduler (FIFO, ASHA).
* ``privacy.data: private`` -- only DP selection (Papernot & Steinke), and only when, before
  any trial runs: the ranking metric is computed without private data, the pipeline has a
  privacy planner, and the selection cost bounded over the whole search space fits the budget.
  Then K (OS entropy, never written) trials with secretly drawn hyperparameters run; only the
  best is released, with the selection event in its ledger; the other trials are deleted
  (``ray_jobs/sweep_private.py``).

What both kinds of sweep share (the sweep config, a trial's config and its Tune trainable) is
``ray_jobs/sweep_trials.py``.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from dpsynth_core.config import load_config
from dpsynth_core.errors import ConfigError
from dpsynth_core.tuning import check_sweep_allowed
from ray_jobs.sweep_trials import SweepConfig, base_for_trials, make_trainable, start_ray, trial_config

def _search_space(config: SweepConfig) -> dict:
    module = importlib.import_module(f"tune_spaces.{config.pipeline}")
    spaces = getattr(module, "SPACES", {})
    if config.space not in spaces:
        raise ConfigError(f"tune_spaces/{config.pipeline}.py has no space '{config.space}' (has: {', '.join(spaces)})")
    return spaces[config.space]()


def run(config: SweepConfig) -> dict:
    from ray import tune

    check_sweep_allowed(config.privacy, config.search, config.scheduler, config.pipeline, config.metric)
    base_path = config.base_config
    if not base_path.is_file():
        raise ConfigError(f"{base_path}: base pipeline config not found")
    base = base_for_trials(base_path)
    space = _search_space(config)
    for key in list(space) + list(config.overrides):
        trial_config(base, config.overrides, {key: 0}, Path("/tmp/check"))  # validates dotted keys early

    if config.privacy.data == "private":
        from ray_jobs.sweep_private import run_private

        return run_private(config, base, space)
    num_samples = config.num_samples
    config.output_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"pipeline": config.pipeline, "num_trials": num_samples}

    concurrency = start_ray(config)
    search_alg = None
    if config.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch(metric=config.metric, mode=config.mode, seed=config.seed)
    scheduler = None
    if config.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(metric=config.metric, mode=config.mode, max_t=1, grace_period=1)

    trainable = make_trainable(config, base, (config.output_dir / "trials").resolve())
    start = time.perf_counter()
    tuner = tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            num_samples=num_samples, max_concurrent_trials=concurrency, search_alg=search_alg,
            scheduler=scheduler, metric=None if scheduler else config.metric,
            mode=None if scheduler else config.mode,
        ),
        run_config=tune.RunConfig(name="sweep", storage_path=str((config.output_dir / "tune").resolve()), verbose=1),
    )
    results = tuner.fit()
    wall = time.perf_counter() - start
    frame = results.get_dataframe()
    errors = [str(r.error) for r in results if r.error]
    if errors and len(errors) == len(results):
        raise RuntimeError(f"all {len(errors)} trials failed; first error: {errors[0][:500]}")
    best = results.get_best_result(metric=config.metric, mode=config.mode)
    config_cols = [c for c in frame.columns if c.startswith("config/")]
    table_cols = config_cols + [c for c in (config.metric, "run_dir") if c in frame.columns]
    frame[table_cols].to_csv(config.output_dir / "results.csv", index=False)
    summary.update(
        wall_seconds=round(wall, 1),
        concurrency=concurrency,
        failed_trials=len(errors),
        best_config=best.config,
        best_metric={config.metric: best.metrics.get(config.metric)},
        best_run_dir=best.metrics.get("run_dir"),
    )
    _plot(frame, config)
    (config.output_dir / "sweep.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _plot(frame, config: SweepConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    numeric = [c for c in frame.columns if c.startswith("config/") and np.issubdtype(frame[c].dtype, np.number)]
    if config.metric not in frame.columns or not numeric:
        return
    fig, axes = plt.subplots(1, len(numeric), figsize=(4 * len(numeric), 3.2), squeeze=False)
    for ax, column in zip(axes[0], numeric):
        ax.scatter(frame[column], frame[config.metric])
        ax.set_xlabel(column.removeprefix("config/"))
        ax.set_ylabel(config.metric)
    fig.suptitle(f"{config.pipeline} sweep: {config.metric} per trial")
    fig.tight_layout()
    fig.savefig(config.output_dir / "sweep.png", dpi=120)
    plt.close(fig)


def main(config_path: Path) -> dict:
    config = load_config(config_path, SweepConfig)
    summary = run(config)
    print(json.dumps(summary, indent=2, default=str))
    if summary.get("message"):
        print(summary["message"])
    return summary


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--config":
        sys.exit("usage: python -m ray_jobs.sweep --config FILE")
    main(Path(sys.argv[2]))
