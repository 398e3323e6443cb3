"""The `dpsynth train` job: its config, its data source and its pre-flight (the run itself:
``dpsynth_core.train.method`` on the run loop, which creates its ledger).

Everything that can be wrong with a config fails here, before any training: epsilon <= 0,
delta >= 1/n (checked before the ledger is created), a logical batch larger than n, an unknown
LoRA target module, a missing column. The command itself lives in ``dpsynth.cli.train``.
"""

from __future__ import annotations

from pathlib import Path

from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from dpsynth_core.config import StrictConfig, load_config
from dpsynth_core.config.budget import BudgetConfig
from dpsynth_core.config.keys import move_keys
from dpsynth_core.config.placement import PlacementSettings
from dpsynth_core.config.resources import StageResources
from dpsynth_core.dpsgd.config import DpSgdConfig
from dpsynth_core.dpsgd.sources import TableExampleSource
from dpsynth_core.errors import ConfigError
from dpsynth_core.runs.preflight import Plan

# how a run executes, not what it outputs: changing them does not make it another run
EXECUTION_ONLY = ("train.stop_after_steps", "train.torch_threads", "train.checkpoint_every", "resources")


class TrainDataSpec(TableExampleSource):
    """Where the private training data is and how a row becomes (prompt, target).

    ``path``: absolute, relative to the working directory, or relative to the data dir
    (../shared/data); resolved to an absolute path before anything is read."""


class LedgerSpec(StrictConfig):
    run_dir: str | None = None  # default: the output directory
    dataset: str = "private"
    epsilon_budget: float | None = Field(None, gt=0)  # default: privacy.epsilon (used only when creating)


class TrainPrivacy(StrictConfig):
    epsilon: float = Field(..., gt=0, allow_inf_nan=False)
    delta: float | None = Field(None, gt=0, lt=1)  # default min(1e-5, m^-1.1), m the declared units


# the sections every method shares, and the DP-SGD engine's fields they fill in (``train`` gets a copy)
SHARED_SECTIONS = {"privacy": ("epsilon", "delta"), "placement": ("device", "dtype")}


class TrainJobConfig(BudgetConfig):
    """The budget under ``privacy:`` and the device under ``placement:`` as in every method (``train.epsilon``,
    ``train.delta``, ``train.device``, ``train.dtype`` load for one release); the DP-SGD engine's config
    (``train``) gets their copy before validation."""

    moved_keys: ClassVar[dict[str, str]] = {f"train.{key}": f"{section}.{key}"
                                            for section, keys in SHARED_SECTIONS.items() for key in keys}

    data: TrainDataSpec
    privacy: TrainPrivacy
    placement: PlacementSettings = Field(default_factory=PlacementSettings)
    train: DpSgdConfig
    output_dir: str = "runs/train"
    stage: str = "dpsgd"
    ledger: LedgerSpec = Field(default_factory=LedgerSpec)
    # each Ray Train worker's request (train.num_workers > 1); unset: Ray Train's default, a GPU where one is used
    resources: StageResources | None = None

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, values):
        values = move_keys(values, cls.moved_keys)
        if isinstance(values, dict) and isinstance(values.get("train"), dict):
            shared = {k: values[section][k] for section, keys in SHARED_SECTIONS.items()
                      if isinstance(values.get(section), dict) for k in keys if k in values[section]}
            values = {**values, "train": {**values["train"], **shared}}
        return values

    def snapshot(self) -> dict:
        """The config as the rerun rule and ``config.yaml`` hold it: each shared key once, in its section."""
        return self.model_dump(mode="json", exclude={"train": {k for keys in SHARED_SECTIONS.values() for k in keys}})

    @field_validator("train")
    @classmethod
    def _no_test_only_knobs(cls, value: DpSgdConfig) -> DpSgdConfig:
        from dpsynth_core.privacy.randomness import refuse_test_only_knobs

        refuse_test_only_knobs("train", value.model_dump())
        return value


def resolve_data_path(raw: str, config_path: Path) -> Path:
    p = Path(raw).expanduser()
    if p.is_absolute():
        return p
    for base in (Path.cwd(), config_path.parent):
        if (base / p).exists():
            return base / p
    from dpsynth_core.data import data_dir

    return data_dir() / p


def data_source(spec: TrainDataSpec, config_path: Path) -> TableExampleSource:
    """The public description of the training data, its path resolved: what Ray workers receive."""
    return TableExampleSource.model_validate({**spec.model_dump(), "path": str(resolve_data_path(spec.path, config_path).resolve())})


def build_examples(spec: TrainDataSpec, config_path: Path):
    """Read the data through ``dpsynth_core.data.load_records`` (errors name file/column/row)."""
    return data_source(spec, config_path).load()


def preflight_train(config_path: Path, fresh: bool = False) -> Plan:
    """Config, the whole data file, delta against its size, and the noise calibration. ``fresh``: the
    run's own ledger is about to be moved aside (``--fresh``), so it is not checked against."""
    path = Path(config_path)
    return preflight_job(load_config(path, TrainJobConfig), path, fresh)


def preflight_job(job: TrainJobConfig, path: Path, fresh: bool = False) -> Plan:
    """:func:`preflight_train` of a loaded config (``path``: where its relative data paths are read from)."""
    from dpsynth_core.dpsgd.budget import plan_privacy
    from dpsynth_core.privacy.randomness import refuse_pinned_dp_seed

    try:  # a pinned seed makes the noise reproducible from this file: tests only (DPSYNTH_TEST_MODE=1)
        refuse_pinned_dp_seed("train.sampling_seed", job.train.sampling_seed)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    source = data_source(job.data, path)
    examples = source.load()
    if not examples:
        raise ConfigError(f"{path}: field 'data': no training records in {job.data.path}")
    try:
        plan = plan_privacy(job.train, examples, ledger=existing_ledger(job, fresh), stage=job.stage)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    stages = [f"{job.stage}: {job.train.steps} DP-SGD steps (noise multiplier {plan.noise_multiplier:.3f})",
              "release"]
    return Plan("train", path, stages, job.train.epsilon, plan.delta, source.path, len(examples),
                Path(job.output_dir))


def existing_ledger(job: TrainJobConfig, fresh: bool = False):
    """The run's ledger if it exists already (opened, never created: pre-flight writes nothing)."""
    from dpsynth_core.privacy import PrivacyLedger

    run_dir = Path(job.ledger.run_dir or job.output_dir)
    if fresh and run_dir == Path(job.output_dir):  # --fresh moves this ledger aside with the old run
        return None
    return PrivacyLedger.open(run_dir) if (run_dir / "ledger.sqlite").is_file() else None
