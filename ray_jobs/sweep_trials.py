"""What a sweep's trials share, public or DP (``ray_jobs/sweep.py``, ``ray_jobs/sweep_private.py``): the
sweep config, a trial's config (the base config plus dotted overrides), the Tune trainable that runs one
trial's pipeline, the Ray start, and the library's view of a Tune search space.
"""

from __future__ import annotations

import copy
import importlib
import json
import math
import secrets
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from dpsynth_core.config import StrictConfig
from dpsynth_core.errors import ConfigError
from dpsynth_core.tuning import TuningPrivacy
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
