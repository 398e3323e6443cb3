"""`dpsynth train` on the run loop: one stage, DP-SGD LoRA fine-tuning (``dpsgd.train_job`` holds its
config, data source and pre-flight).

Its ledger may live in another run's directory (``ledger.run_dir``: runs that share one budget), so
the method names its ledger directory; the release is written beside that ledger. The unit of privacy
is a user when ``data.user_col`` is set (user-level DP-SGD), else a record.
"""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.dpsgd.train_job import EXECUTION_ONLY, TrainJobConfig, data_source
from dpsynth_core.dpsgd.sampling import PrivacyUnits
from dpsynth_core.errors import ConfigError
from dpsynth_core.run_loop.reserve import adopt_reservations
from dpsynth_core.runs.contract import Method, PrivacyPlan, Stage, StageInterrupted


class TrainStopped(StageInterrupted):
    """Training stopped early (``train.stop_after_steps``, a test knob); a rerun resumes from the checkpoint."""


class TrainMethod(Method):
    """One DP-SGD stage. ``config_path``: where relative data paths are read from; ``train_runner``:
    Ray Train for ``num_workers > 1`` (the driver passes ``ray_jobs.dp_finetune.run_dp_finetune``)."""

    kind = "dp-sgd lora"
    config: TrainJobConfig

    def __init__(self, config: TrainJobConfig, config_path: Path, *, resume_checkpoint: bool = True,
                 progress: bool = False, train_runner=None, fresh: bool = False) -> None:
        super().__init__(config)
        self.config_path = Path(config_path)
        self.resume_checkpoint, self.progress, self.train_runner, self.fresh = resume_checkpoint, progress, train_runner, fresh
        self.result = None  # the TrainResult once the stage ran in this process
        self.units: tuple[int, bool] | None = None  # (privacy units, user-level), counted by the pre-flight

    def stages(self) -> list[Stage]:
        return [Stage(self.config.stage, self._train, records=("dpsgd",), reads_private=True, plan=self._plan)]

    def run_dir(self) -> Path:
        return Path(self.config.output_dir)

    def ledger_dir(self, root: Path) -> Path:
        return Path(self.config.ledger.run_dir or root)

    def identity(self) -> tuple[dict, tuple[str, ...]]:
        return self.config.snapshot(), EXECUTION_ONLY

    def privacy_plan(self) -> PrivacyPlan:
        """The whole file, delta against its size, the noise calibration against the ledger (``preflight_train``)."""
        from dpsynth_core.dpsgd.train_job import preflight_job

        job = self.config
        preflight_job(job, self.config_path, fresh=self.fresh)
        units = PrivacyUnits.from_user_ids([e.user_id for e in data_source(job.data, self.config_path).load()])
        self.units = (len(units), units.user_level)  # the count DP-SGD accounting treats as public
        return PrivacyPlan(job.ledger.dataset, job.train.epsilon, job.train.delta, job.train.public_num_units or len(units),
                           delta_field="privacy.delta", budget=job.ledger.epsilon_budget)

    def release_items(self, root: Path) -> dict[str, Path]:
        """The adapter (with its privacy summary); the loss curve is owner-only."""
        adapter = Path(self.config.output_dir) / "adapter"
        merged = Path(self.config.output_dir) / "merged"
        return {"adapter": adapter, **({"merged": merged} if merged.is_dir() else {})}

    def _plan(self, job: TrainJobConfig, ledger) -> list:
        """The DP-SGD event, calibrated as the stage will (``plan_privacy``) from the unit count of the pre-flight."""
        from dpsynth_core.dpsgd.budget import plan_for_units

        try:
            return [(job.stage, plan_for_units(job.train, *self.units, ledger=ledger, stage=job.stage).event())]
        except ConfigError as exc:
            raise ConfigError(f"{self.config_path}: {exc}") from None

    def _train(self, job: TrainJobConfig, root: str) -> dict:
        from dpsynth_core.dpsgd import train_dp_lora
        from dpsynth_core.dpsgd.budget import plan_privacy
        from dpsynth_core.privacy import PrivacyLedger, check_delta_for_size

        source = data_source(job.data, self.config_path)
        examples = source.load()
        ledger = PrivacyLedger.open(self.ledger_dir(Path(root)))
        adopt_reservations(ledger, root, job.stage)  # the loop reserved this stage's event: train with its noise
        try:
            check_delta_for_size(ledger.delta, _units(examples), field="privacy.delta (the ledger's delta)")
            plan_privacy(job.train, examples, ledger=ledger, stage=job.stage)  # every check, before training
        except ConfigError as exc:
            raise ConfigError(f"{self.config_path}: {exc}") from None
        # in-process: the examples already read; on Ray: the source, which each worker loads itself
        result = train_dp_lora(examples if self.train_runner is None else source, job.train, output_dir=Path(root),
                               ledger=ledger, stage=job.stage, progress=self.progress, resume=self.resume_checkpoint,
                               runner=self.train_runner)
        self.result = result
        if not result.completed:
            raise TrainStopped(f"stopped after {result.steps} steps (stop_after_steps); rerun to resume")
        return {"steps": result.steps, "epsilon": result.epsilon}


def _units(examples) -> int:
    from dpsynth_core.dpsgd.sampling import PrivacyUnits

    return len(PrivacyUnits.from_user_ids([e.user_id for e in examples]))
