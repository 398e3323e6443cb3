"""A job: one method's typed config, built from YAML or in code, then run in-process or on Ray.

    run = ACTG.from_yaml("configs/actg_tiny.yaml").with_privacy(epsilon=2.0).run()
    run.ledger.epsilon, run.release_dir

Every builder returns a new job whose config went through the same validation as a config file
(unknown keys and bad values are errors naming the field); the run goes through the same run loop
(``dpsynth_core.run_loop``) as ``dpsynth run``: lock, rerun rule, resume, ledger, release.
"""

from __future__ import annotations

import copy
import importlib
import math
import os
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml
from pydantic import ValidationError

from dpsynth.api.run import Run
from dpsynth_core.run_loop import RunResult
from dpsynth_core.errors import ConfigError

J = TypeVar("J", bound="Job")


def _set(raw: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for key in parents:
        raw = raw.setdefault(key, {})
    raw[leaf] = value


class Job(ABC):
    """One method's run, not yet started. Subclasses name their config class and privacy keys."""

    method: ClassVar[str]  # as `dpsynth run <method>` names it
    config_class: ClassVar[type]
    epsilon_key: ClassVar[str] = "privacy.epsilon"
    delta_key: ClassVar[str] = "privacy.delta"
    has_reference_runs: ClassVar[bool] = True
    ray_driver: ClassVar[str | None] = None  # the ray_jobs module that places its stages on a cluster

    def __init__(self, raw: dict, source: Path | None = None) -> None:
        """``raw``: the config mapping (paths already resolved); ``source``: the file it came from, if any."""
        from dpsynth_core.config.keys import move_keys
        from dpsynth_core.config.strict import format_validation_error

        # keys moved into a section (top-level epsilon -> privacy.epsilon) in their new place, so builders set one
        self._raw = move_keys(copy.deepcopy(raw), getattr(self.config_class, "moved_keys", {}))
        self.source = source
        try:
            self.config = self.config_class.model_validate(self._raw)
        except ValidationError as exc:
            raise ConfigError(f"{source or self.method}: {format_validation_error(exc)}") from None

    @classmethod
    def from_yaml(cls: type[J], path: str | Path) -> J:
        """Load a config file as ``dpsynth run`` does (old key names accepted with a line naming the new one)."""
        from dpsynth_core.config import load_config
        from dpsynth_core.config.paths import resolve_input_paths

        path = Path(path)
        load_config(path, cls.config_class)  # every file-level check, with the file's name in its errors
        return cls(resolve_input_paths(yaml.safe_load(path.read_text(encoding="utf-8")), path.parent), source=path)

    @classmethod
    def from_dict(cls: type[J], raw: dict) -> J:
        return cls(raw)

    def _with(self: J, **updates: Any) -> J:
        raw = copy.deepcopy(self._raw)
        for dotted, value in updates.items():
            _set(raw, dotted, value)
        return type(self)(raw, self.source)

    def with_privacy(self: J, epsilon: float, delta: float | None = None) -> J:
        """The budget epsilon (and delta; None: min(1e-5, m^-1.1) for the declared working-set size m)."""
        return self._with(**{self.epsilon_key: float(epsilon), self.delta_key: delta})

    with_differential_privacy = with_privacy  # NeMo Safe Synthesizer's name for the same step

    def as_reference(self: J) -> J:
        """epsilon = inf: no DP noise, a non-private reference run, marked NOT PRIVATE in its ledger and release."""
        if not self.has_reference_runs:
            raise ConfigError(f"{self.method}: epsilon = inf reference runs are not supported by this method yet")
        return self._with(**{self.epsilon_key: math.inf, "not_private": True})

    def with_output(self: J, output_dir: str | Path, name: str | None = None) -> J:
        return self._with(output_dir=str(output_dir), **({"name": name} if name is not None else {}))

    def run(self, *, fresh: bool = False, cluster: str | None = None) -> Run:
        """Run (or resume) the job. ``cluster`` None: in this process; ``"auto"``: through the Ray drivers
        (``$RAY_ADDRESS``'s cluster, else an embedded Ray); ``"HOST:PORT"``: that cluster's drivers."""
        started = time.time()
        if cluster not in (None, "auto"):
            os.environ["RAY_ADDRESS"] = cluster
        run_dir = self._run_local(not fresh) if cluster is None else self._run_on_ray(not fresh)
        return Run(RunResult(Path(run_dir), Path(self._ledger_dir(Path(run_dir))), started))

    def _ledger_dir(self, run_dir: Path) -> Path:
        return run_dir

    @abstractmethod
    def _run_local(self, resume: bool) -> Path:
        """Every stage in this process; the run directory."""

    def _run_on_ray(self, resume: bool) -> Path:
        """Through the method's Ray driver (``ray_driver``: a ``ray_jobs`` module with ``run_on_ray(config, resume=)``);
        a method without one runs in this process either way. The run directory."""
        if self.ray_driver is None:
            return self._run_local(resume)
        # imported here: a job that never meets a cluster never imports Ray
        return importlib.import_module(self.ray_driver).run_on_ray(self.config, resume=resume)
