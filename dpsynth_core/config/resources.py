"""What a pipeline stage asks its scheduler for: CPUs, GPUs, memory (Ray-free).

A config holds one :class:`PipelineResources` (defaults that fit a laptop, per-stage overrides)::

    resources:
      cpus: 2                  # every stage, unless overridden
      stages:
        private: {gpus: 1}     # the DP-SGD stage asks for a GPU

``cpus: null`` (the default) means "up to 2, as many as the largest node offers", so the same
config runs on a 1-CPU test node and on a laptop; a number is honoured exactly. The Ray drivers
turn a :class:`StageResources` into task/actor options with :meth:`StageResources.ray_options`.
Ray hides GPUs from a task that requests none, so a stage meant for a GPU must say ``gpus: 1``.
"""

from __future__ import annotations

from pydantic import Field

from dpsynth_core.config import StrictConfig

LAPTOP_CPUS = 2  # the default stage size when cpus is left open


class StageResources(StrictConfig):
    """One stage's request. ``None`` fields inherit (from the pipeline default, then the laptop default)."""

    cpus: float | None = Field(None, gt=0)
    gpus: float | None = Field(None, ge=0)
    memory_gb: float | None = Field(None, gt=0)  # Ray's logical memory resource (scheduling only)

    def over(self, base: StageResources) -> StageResources:
        """This request, with unset fields taken from ``base``."""
        return StageResources(**{k: getattr(self, k) if getattr(self, k) is not None else getattr(base, k)
                                 for k in ("cpus", "gpus", "memory_gb")})

    def ray_options(self, max_cpus: float | None = None) -> dict:
        """``num_cpus``/``num_gpus``/``memory`` for ``.options(...)``. An open ``cpus`` takes
        ``min(2, max_cpus)``; a stated one is kept as is."""
        cpus = self.cpus if self.cpus is not None else min(LAPTOP_CPUS, max_cpus or LAPTOP_CPUS)
        opts: dict = {"num_cpus": cpus, "num_gpus": self.gpus or 0}
        if self.memory_gb:
            opts["memory"] = int(self.memory_gb * 1024**3)
        return opts


class PipelineResources(StageResources):
    """A default for every stage plus per-stage overrides (keys are stage names)."""

    stages: dict[str, StageResources] = Field(default_factory=dict)

    def for_stage(self, name: str) -> StageResources:
        base = StageResources(cpus=self.cpus, gpus=self.gpus, memory_gb=self.memory_gb)
        return self.stages[name].over(base) if name in self.stages else base
