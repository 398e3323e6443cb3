"""One job class per method (``Job``): ACTG, WASP, AugPE, DPFairLLM, AIM, Train."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import ClassVar

from dpsynth.api.job import Job
from dpsynth_core.errors import ConfigError
from dpsynth_core.actg.config import ActgConfig
from dpsynth_core.dpsgd.train_job import TrainJobConfig
from dpsynth_core.pe.config import PEConfig
from dpsynth_core.tabular.config import AimConfig, DpFairConfig


class ACTG(Job):
    """ACTG-ARL (attributes -> AIM features -> DP conditional generator -> Best-of-N -> Anchored RL)."""

    method, config_class, ray_driver = "actg", ActgConfig, "ray_jobs.actg"

    def _run_local(self, resume: bool) -> Path:
        from dpsynth_core.actg.pipeline import run_pipeline

        return run_pipeline(self.config, resume=resume)


class _PE(Job):
    """WASP / Aug-PE: PLMs placed as their ``backend`` says (``hf``: in this process; Ray and Serve
    backends start or join Ray either way)."""

    config_class: ClassVar[type] = PEConfig
    ray_driver = "ray_jobs.pe_driver"

    def __init__(self, raw: dict, source: Path | None = None) -> None:
        super().__init__({"method": self.method, **raw}, source)
        if self.config.method != self.method:
            raise ConfigError(f"{source or self.method}: field 'method' is '{self.config.method}', not '{self.method}'")

    def _run_local(self, resume: bool) -> Path:
        from dpsynth_core.pe.pipeline import run_pe_method
        from ray_jobs.pe_backends import make_llms

        return run_pe_method(self.config, make_llms, resume=resume)


class WASP(_PE):
    method = "wasp"


class AugPE(_PE):
    method = "augpe"


class DPFairLLM(Job):
    """DPFairLLM: DP and fair tabular synthesis with a fine-tuned LLM."""

    method, config_class, ray_driver = "dpfair", DpFairConfig, "ray_jobs.dpfair"

    def resolved_config(self, run_dir: str | Path | None = None) -> dict:
        """The config as a run resolves it (``dpsynth config resolve``): defaults and ``recipe`` values filled in;
        given a run directory, the choices that run made from its DP tables (``stratify: auto``). Public config."""
        from dpsynth_core.tabular.stages_dp import resolved_config

        return resolved_config(self.config, Path(run_dir) if run_dir is not None else None)

    def _run_local(self, resume: bool) -> Path:
        from dpsynth_core.tabular.pipeline import run_dpfair

        return run_dpfair(self.config, resume=resume)


class AIM(Job):
    """The AIM baseline (smartnoise-synth): one process, with or without a cluster."""

    method, config_class = "aim", AimConfig

    def _run_local(self, resume: bool) -> Path:
        from dpsynth_core.tabular.aim_run import run_aim

        return run_aim(self.config, resume=resume)


class Train(Job):
    """`dpsynth train`: DP-SGD LoRA fine-tuning (Ray Train when ``train.num_workers > 1``)."""

    method, config_class = "train", TrainJobConfig
    has_reference_runs = False

    def run(self, *, fresh: bool = False, cluster: str | None = None, resume_checkpoint: bool = True,
            progress: bool = False):
        self._options = {"resume_checkpoint": resume_checkpoint, "progress": progress, "fresh": fresh}
        return super().run(fresh=fresh, cluster=cluster)

    def method_object(self, **options):
        from dpsynth_core.train.method import TrainMethod

        runner = None
        if self.config.train.num_workers > 1:  # Ray Train: the API is the driver, it hands the engine the runner
            from ray_jobs.dp_finetune import run_dp_finetune

            runner = functools.partial(run_dp_finetune, resources=self.config.resources)
        return TrainMethod(self.config, self.source or Path.cwd() / "train.yaml", train_runner=runner, **options)

    def _ledger_dir(self, run_dir: Path) -> Path:
        return Path(self.config.ledger.run_dir or run_dir)

    def _run_local(self, resume: bool) -> Path:
        from dpsynth_core.run_loop import run_method

        return run_method(self.method_object(**getattr(self, "_options", {})), resume=resume).run_dir


METHODS: dict[str, type[Job]] = {cls.method: cls for cls in (ACTG, WASP, AugPE, DPFairLLM, AIM, Train)}
