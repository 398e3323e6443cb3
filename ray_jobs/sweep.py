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
  best is released, with the selection event in its ledger; the other trials are deleted.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import secrets
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import Field

from dpsynth_core.config import StrictConfig, load_config
from dpsynth_core.errors import ConfigError
from dpsynth_core.tuning import TuningPrivacy, check_sweep_allowed, draw_num_trials
from dpsynth_core.tuning.space import Choice, Interval, SearchSpace

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
    gpus_per_trial: float = Field(0.0, ge=0, description="GPUs in each trial's stage bundle (a GPU stage needs them).")
    max_concurrent_trials: int | None = Field(None, gt=0, description="Default: cluster CPUs / cpus_per_trial.")
    seed: int = 0
    output_dir: Path = Path("runs/sweep")
    privacy: TuningPrivacy
    bound_cells: int = Field(4, ge=1, le=64, description="Grid cells per monotone range when bounding a DP sweep "
                             "(more: a tighter bound, one planned trial per extra grid point).")


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
    config.pop("run_dir", None)  # the old key name (config/keys.py); a base config may use either
    config["output_dir"] = str(run_dir)
    return config


def base_for_trials(base_path: Path) -> dict:
    """The base config with its relative input paths (``schema_path``, ``data.path`` ...) made absolute,
    next to the base config else in the current directory, as ``load_config`` finds them: a trial's
    config is written to the trials directory and runs in Tune's trial directory, where neither holds."""
    from dpsynth_core.config.paths import resolve_input_paths

    base = yaml.safe_load(base_path.read_text()) or {}
    return resolve_input_paths(resolve_input_paths(base, base_path.parent), Path.cwd())


def flatten(metrics: dict, prefix: str = "") -> dict[str, float]:
    flat: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            flat[name] = float(value)
    return flat


TRIAL_PARAMS = "trial"  # a DP sweep's Tune space: the trial's own configuration, as JSON


def run_trial(params: dict, *, pipeline: str, base: dict, overrides: dict, trials_dir: str, metric: str | None = None,
              private: bool = False) -> None:
    """One Tune trial: write the trial's config, run the pipeline, report its metrics.

    In a DP sweep (``private``) the trial reports only ``metric`` (private-free) and its run
    directory, and a failure after the pipeline wrote ``release/`` and that metric (its owner-side
    evaluation of held-out rows) does not drop the trial: the score it reports is the same either
    way, so the selection never depends on held-out data."""
    from ray import tune

    if private:
        params = json.loads(params[TRIAL_PARAMS])
    # a random name: Tune's trial ids carry the trial's index, which would tell how many ran
    run_dir = Path(trials_dir) / secrets.token_hex(6)
    run_dir.mkdir(parents=True, exist_ok=False)
    config_path = run_dir.parent / f"{run_dir.name}.yaml"
    config_path.write_text(yaml.safe_dump(trial_config(base, overrides, params, run_dir), sort_keys=False))
    driver = importlib.import_module(f"ray_jobs.{pipeline}")
    if not private:
        out_dir = Path(driver.main(config_path, resume=True))
        metrics = json.loads((out_dir / "metrics.json").read_text())
        tune.report({**flatten(metrics), "run_dir": str(out_dir)})
        return
    try:
        driver.main(config_path, resume=True)
    except Exception:
        if not (run_dir / "release" / "MANIFEST.json").is_file():
            raise  # failed before its DP outputs existed: ranked last, like any failed trial
    score = flatten(json.loads((run_dir / "metrics.json").read_text())).get(metric) \
        if (run_dir / "metrics.json").is_file() else None
    tune.report({metric: score, "run_dir": str(run_dir)} if score is not None else {"run_dir": str(run_dir)})


def _search_space(config: SweepConfig) -> dict:
    module = importlib.import_module(f"tune_spaces.{config.pipeline}")
    spaces = getattr(module, "SPACES", {})
    if config.space not in spaces:
        raise ConfigError(f"tune_spaces/{config.pipeline}.py has no space '{config.space}' (has: {', '.join(spaces)})")
    return spaces[config.space]()


def library_space(ray_space: dict) -> SearchSpace:
    """The Ray Tune space as bounded choices and intervals (for the whole-space bound and secret
    draws); domains that cannot be drawn secretly or bounded are refused."""
    from ray.tune.search.sample import Categorical, Domain, Float, Integer

    space: SearchSpace = {}
    for key, domain in ray_space.items():
        sampler = type(domain.get_sampler()).__name__ if isinstance(domain, Domain) else None
        if not isinstance(domain, (Domain, dict)) and not callable(domain):
            space[key] = Choice((domain,))
        elif isinstance(domain, Categorical):
            space[key] = Choice(tuple(domain.categories))
        elif isinstance(domain, Float) and sampler in ("_Uniform", "_LogUniform"):
            space[key] = Interval(float(domain.lower), float(domain.upper), log=sampler == "_LogUniform")
        elif isinstance(domain, Integer) and sampler == "_Uniform" and domain.upper - domain.lower <= 256:
            space[key] = Choice(tuple(range(int(domain.lower), int(domain.upper))))
        else:
            raise ConfigError(f"refusing a DP sweep: search-space key '{key}' ({type(domain).__name__}) is not a "
                              "tune.choice, tune.uniform/loguniform or a small tune.randint; it cannot be drawn "
                              "from secret randomness and bounded")
    return space


def start_ray(config: SweepConfig) -> int:
    """Join the cluster (RAY_ADDRESS / submitted job) or embed a local Ray; the trial concurrency."""
    import ray

    from ray_jobs.cluster import ensure_ray

    ensure_ray()
    cpus = ray.cluster_resources().get("CPU", 1.0)
    # a trial = a driver (1 CPU bundle) + its pipeline's stage tasks (a cpus_per_trial bundle)
    return config.max_concurrent_trials or max(1, int(cpus // (1 + config.cpus_per_trial)))


def make_trainable(config: SweepConfig, base: dict, trials_dir: Path, private: bool = False):
    from ray import tune

    return tune.with_resources(
        tune.with_parameters(
            run_trial, pipeline=config.pipeline, base=base, overrides=config.overrides, trials_dir=str(trials_dir),
            metric=config.metric, private=private,
        ),
        tune.PlacementGroupFactory([{"CPU": 1}, {"CPU": config.cpus_per_trial,
                                                 **({"GPU": config.gpus_per_trial} if config.gpus_per_trial else {})}]),
    )


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
