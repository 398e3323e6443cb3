"""Privacy-aware hyperparameter sweeps on Ray Tune.

    dpsynth tune --config configs/sweep_actg_tiny.yaml

Each trial is a driver function that writes the trial's pipeline config (the base config plus
the sampled overrides) and runs the pipeline's stages (``ray_jobs/<pipeline>.main``), then
reports the pipeline's ``metrics.json``. Privacy (see ``dpsynth_core.tuning``):

* ``privacy.data: public`` -- any search (random, Optuna) and scheduler (FIFO, ASHA).
* ``privacy.data: private`` -- only DP selection: K ~ Poisson(mu) random trials, best released,
  cost (Papernot & Steinke) recorded in the sweep's ledger; refused otherwise, before any trial.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import Field

from dpsynth_core.config import StrictConfig, load_config
from dpsynth_core.errors import ConfigError
from dpsynth_core.tuning import TuningPrivacy, check_sweep_allowed, sample_num_trials

PIPELINES = ("actg", "dpfair", "wasp", "augpe")


class SweepConfig(StrictConfig):
    pipeline: Literal["actg", "dpfair", "wasp", "augpe"]
    base_config: Path
    space: str = Field("default", description="Name of a search space in tune_spaces/<pipeline>.py")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Fixed dotted-key overrides for every trial.")
    num_samples: int = Field(4, gt=0, description="Trials for a public sweep (a DP sweep draws K at random).")
    metric: str = "mauve"
    mode: Literal["max", "min"] = "max"
    search: Literal["random", "optuna"] = "random"
    scheduler: Literal["fifo", "asha"] = "fifo"
    cpus_per_trial: float = Field(1.0, gt=0)
    max_concurrent_trials: int | None = Field(None, gt=0, description="Default: cluster CPUs / cpus_per_trial.")
    seed: int = 0
    output_dir: Path = Path("runs/sweep")
    privacy: TuningPrivacy


def set_dotted(config: dict, key: str, value: Any) -> None:
    """Set ``a.b.c`` (or ``plms.0.temperature``) in a nested config. Missing dict sections are
    created; the pipeline's strict config then rejects any unknown key when the trial loads it."""
    parts = key.split(".")
    node: Any = config
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"override '{key}': '{'.'.join(parts[:i])}' has no item {part}")
            node = node[int(part)]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise ConfigError(f"override '{key}': '{'.'.join(parts[:i])}' is not a section")
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"override '{key}': no item {last}")
        node[int(last)] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"override '{key}': parent is not a section")


def trial_config(base: dict, overrides: dict[str, Any], params: dict[str, Any], run_dir: Path) -> dict:
    config = copy.deepcopy(base)
    for key, value in {**overrides, **params}.items():
        set_dotted(config, key, value)
    config["run_dir"] = str(run_dir)
    return config


def flatten(metrics: dict, prefix: str = "") -> dict[str, float]:
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            flat[name] = float(value)
    return flat


def run_trial(params: dict, *, pipeline: str, base: dict, overrides: dict, trials_dir: str) -> None:
    """One Tune trial: write the trial's config, run the pipeline, report its metrics."""
    from ray import tune

    trial_id = tune.get_context().get_trial_id()
    run_dir = Path(trials_dir) / trial_id
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir.parent / f"{trial_id}.yaml"
    config_path.write_text(yaml.safe_dump(trial_config(base, overrides, params, run_dir), sort_keys=False))
    driver = importlib.import_module(f"ray_jobs.{pipeline}")
    out_dir = Path(driver.main(config_path, resume=True))
    metrics = json.loads((out_dir / "metrics.json").read_text())
    tune.report({**flatten(metrics), "run_dir": str(out_dir)})


def _search_space(config: SweepConfig) -> dict:
    module = importlib.import_module(f"tune_spaces.{config.pipeline}")
    spaces = getattr(module, "SPACES", {})
    if config.space not in spaces:
        raise ConfigError(f"tune_spaces/{config.pipeline}.py has no space '{config.space}' (has: {', '.join(spaces)})")
    return spaces[config.space]()


def _trial_events(run_dir: Path) -> list:
    from dpsynth_core.privacy import PrivacyLedger

    return [e for e in PrivacyLedger.open(run_dir).events() if e.kind != "post_processing"]


def run(config: SweepConfig) -> dict:
    import ray
    from ray import tune

    check_sweep_allowed(config.privacy, config.search, config.scheduler)
    base_path = config.base_config
    if not base_path.is_file():
        raise ConfigError(f"{base_path}: base pipeline config not found")
    base = yaml.safe_load(base_path.read_text()) or {}
    space = _search_space(config)
    for key in list(space) + list(config.overrides):
        trial_config(base, config.overrides, {key: 0}, Path("/tmp/check"))  # validates dotted keys early

    num_samples = config.num_samples
    if config.privacy.data == "private":
        num_samples = sample_num_trials(config.privacy, np.random.default_rng(config.seed))
    config.output_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"pipeline": config.pipeline, "num_trials": num_samples}
    if num_samples == 0:
        summary["released"] = None  # K = 0: nothing runs, nothing is released, nothing is spent
        (config.output_dir / "sweep.json").write_text(json.dumps(summary, indent=2))
        return summary

    if not ray.is_initialized():
        ray.init(include_dashboard=False)
    cpus = ray.cluster_resources().get("CPU", 1.0)
    # a trial = a driver (1 CPU bundle) + its pipeline's stage tasks (a cpus_per_trial bundle)
    concurrency = config.max_concurrent_trials or max(1, int(cpus // (1 + config.cpus_per_trial)))
    search_alg = None
    if config.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        search_alg = OptunaSearch(metric=config.metric, mode=config.mode, seed=config.seed)
    scheduler = None
    if config.scheduler == "asha":
        from ray.tune.schedulers import ASHAScheduler

        scheduler = ASHAScheduler(metric=config.metric, mode=config.mode, max_t=1, grace_period=1)

    trials_dir = (config.output_dir / "trials").resolve()
    trainable = tune.with_resources(
        tune.with_parameters(
            run_trial, pipeline=config.pipeline, base=base, overrides=config.overrides, trials_dir=str(trials_dir)
        ),
        tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": config.cpus_per_trial}]),
    )
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
    if config.privacy.data == "private":
        summary["privacy"] = _record_selection_cost(config, frame)
    _plot(frame, config)
    (config.output_dir / "sweep.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def _record_selection_cost(config: SweepConfig, frame) -> dict:
    """Record the DP selection in the sweep's own ledger. Its cost depends on the trials'
    configurations (their ledgers' events), never on their results, so the decision to
    release or withhold the best trial leaks nothing."""
    from dpsynth_core.errors import BudgetExceededError
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.tuning import selection_event

    run_dirs = [Path(d) for d in frame["run_dir"].dropna()]
    trial_ledger = PrivacyLedger.open(run_dirs[0])
    event = selection_event([_trial_events(d) for d in run_dirs], config.privacy)
    ledger = PrivacyLedger.create(
        config.output_dir, dataset=trial_ledger.dataset,
        epsilon_budget=config.privacy.epsilon_budget, delta=trial_ledger.delta,
    )
    info = {"epsilon": event.epsilon(trial_ledger.delta), "delta": trial_ledger.delta,
            "mean_trials": config.privacy.mean_trials, "distribution": config.privacy.distribution,
            "budget": config.privacy.epsilon_budget, "ledger": str(config.output_dir / "ledger.sqlite")}
    try:
        ledger.record("hyperparameter_selection", event, {"trials": len(run_dirs)})
        info["released"] = True
    except BudgetExceededError as exc:
        info["released"] = False
        info["reason"] = str(exc)
    return info


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
    return summary


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--config":
        sys.exit("usage: python -m ray_jobs.sweep --config FILE")
    main(Path(sys.argv[2]))
