"""Typed configs of the tabular runs: DPFairLLM (``dpsynth run dpfair``) and the AIM baseline
(``dpsynth run aim``), one release and one ledger per run directory.

Both share :class:`TableRunConfig`: the private table (``data``), the public schema and the
columns used, and the budget (epsilon, delta). The data settings are public config; the rows
they point at are read from their source by whichever process needs them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import Field, PrivateAttr, model_validator

from dpsynth_core.config.record_level import RecordLevelData
from dpsynth_core.config.placement import PlacementSettings
from dpsynth_core.config import (
    BATCH_CAP, OUTPUT_ROWS_CAP, RECORDS_CAP, SEQ_LEN_CAP, STEPS_CAP, THREADS_CAP, StrictConfig, cap, load_config,
)
from dpsynth_core.config.resources import StageResources
from dpsynth_core.dpsgd.config import LoraSettings
from dpsynth_core.privacy.reference_runs import ReferenceRunConfig
from dpsynth_core.runs.storage import RunDirPath, require_durable_run_dir


def _one_or_many(value):
    """A sensitive attribute given as one name, or several as a list (non-empty, no repeats)."""
    if isinstance(value, list) and (not value or len(set(value)) != len(value)):
        raise ValueError(f"sensitive: give a non-empty list of distinct columns, not {value}")
    return value


Weight = float | dict[str, float]  # one weight shared by every sensitive attribute, or one per attribute


def _refuse_removed(raw, section: str, removed: dict[str, str]):
    """Before validation: a key DPFairLLM no longer has is an error naming it and why it went."""
    if isinstance(raw, dict):
        for key in removed:
            if key in raw:
                raise ValueError(f"{section}.{key} was removed ({removed[key]}); delete it from the config")
    return raw


class FairGenerationSettings(StrictConfig):
    """Fairness-aware generation: the rejection sampler and the label tilt, for every attribute in
    ``sensitive`` (one name or a list; default: the schema's first sensitive attribute)."""

    enabled: bool = False
    sensitive: str | list[str] | None = None
    max_dp_gap: float | None = Field(0.05, ge=0)  # per attribute
    max_eo_gap: float | None = Field(None, ge=0)  # per attribute
    # the target P(Y = pos | A = a) of every enforced attribute is
    # (1 - rate_mix) x P(Y = pos) + rate_mix x P(Y = pos | A = a), both from the run's DP (A, Y) table
    # (fair_targets.json, pooled with the marginals' releases of it: tabular.dp_pooling): 0 = demographic
    # parity; between 0 and 1, labels that keep part of the groups' difference, which costs their true
    # positives less (a smaller equalized-odds gap) for a parity gap of about rate_mix x the data's.
    # Binary targets.
    rate_mix: float = Field(0.0, ge=0, le=1)
    warmup_rows: Annotated[int, OUTPUT_ROWS_CAP] = Field(50, ge=0)  # accept unconditionally until this many rows
    # decoding-time tilt of the positive label's logit per group towards the target rates (or the overall
    # generated rate), beside the rejection sampler (tabular.fair_decoding); step of its controller
    tilt: bool = False
    tilt_step: float = Field(0.5, gt=0, le=5)
    # rate_mix's rates once the run has read them from its DP tables ({attribute: {group: rate}}): set by
    # with_rates (post-processing of DP outputs), never by a config
    _rates: dict[str, dict[str, float]] | None = PrivateAttr(None)

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, raw):
        return _refuse_removed(raw, "generation.fairness", {
            "target_rates": "hand-set rates; rate_mix sets them from the run's DP (A, Y) tables"})

    @model_validator(mode="after")
    def _check(self):
        _one_or_many(self.sensitive)
        if self.rate_mix > 0 and not self.enabled:
            raise ValueError("generation.fairness.rate_mix sets fair generation's targets: set enabled: true")
        return self

    def with_rates(self, rates: dict[str, dict[str, float]]) -> FairGenerationSettings:
        """A copy whose targets are ``rates`` ({attribute: {group: rate}}), rate_mix then spent."""
        copy = self.model_copy(update={"rate_mix": 0.0})
        copy._rates = rates
        return copy

    def attributes(self, schema_sensitive: list[str]) -> list[str]:
        """The attributes generation enforces (``sensitive``, else the schema's first one)."""
        if self.sensitive is not None:
            return [self.sensitive] if isinstance(self.sensitive, str) else list(self.sensitive)
        return schema_sensitive[:1]

    @property
    def target_rates(self) -> dict[str, dict[str, float]] | None:
        """The per-group target rates the run set (:meth:`with_rates`); None: parity."""
        return self._rates

    def targets_for(self, attribute: str, attributes: list[str]) -> dict[str, float] | None:
        """The target rates of one attribute (None: parity)."""
        return (self._rates or {}).get(attribute)


class CalibrationSettings(StrictConfig):
    """Generate ``pool_factor`` x ``num_rows`` rows, rake them to the run's DP 1-way marginals (the
    ``marginals`` stage, ``budget.marginals``) and release ``num_rows`` of them (``tabular.calibrate``;
    post-processing). With ``fairness`` and fairness-aware generation on, the (A, Y) cells of each
    enforced attribute are raked to demographic parity too (``rate_mix``'s rates when set).
    ``pairs_with_target``: the marginals stage also releases each column's 2-way histogram with the
    target (K - 1 more compositions under the same ``budget.marginals``) and the pool is raked to them
    (the (A, Y) pair of an attribute raked to parity is left out). ``pairs_with_sensitive``: also each
    sensitive attribute's 2-way table with every other feature (one more composition per table), raked
    to: the released rows then keep the data's tie between A and its proxies (marital status, hours),
    so labels ranked within each group (``labels: dp_tables``) give a downstream model a reason to
    offset the proxies (Adult, eps = 1: at 300 released rows DP gap 0.18 -> 0.12, EO 0.18 -> 0.07; at 100
    the tables' own noise cost about what they gained: docs/guides/dpfair.md)."""

    enabled: bool = False
    pool_factor: float = Field(3.0, ge=1, le=20)
    fairness: bool = True
    pairs_with_target: bool = False
    pairs_with_sensitive: bool = False
    # where the released rows' target comes from: the generator, or a ranking by the naive-Bayes score of
    # the DP (column, target) tables (tabular.labeller; needs pairs_with_target and a binary target)
    labels: Literal["generator", "dp_tables"] = "generator"
    # dp_tables: pseudo-rows added to every cell of the (column, target) tables before the score reads
    # them, in units of the tables' noise sd (from the ledger): noisy sparse cells shrink towards no evidence
    label_prior: float = Field(0.0, ge=0, le=100)
    # dp_tables: where each group's cut is taken: the pool as generated, or the pool raked to the DP
    # feature tables (1-way, and (column, A) with pairs_with_sensitive), i.e. where the data's rows of that
    # group would reach the rate
    label_cut: Literal["pool", "raked"] = "pool"
    # categorical columns whose values are fixed per generated row, in the shares of their DP table: one
    # column (e.g. the sensitive one) by its 1-way marginal, two by their released 2-way table (one of
    # them the target with pairs_with_target, or a sensitive attribute with pairs_with_sensitive). A
    # generator that writes 90 % men, or women married as often as men, still leaves the raking the
    # rows the data has. None: every value is the generator's. auto: the enforced sensitive attribute(s)
    # and a proxy chosen from the run's DP (column, A) tables (tabular.strata; needs pairs_with_sensitive)
    stratify: str | list[str] | None = None

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, raw):
        return _refuse_removed(raw, "generation.calibrate", {
            "max_weight": "raking weights are capped at 20 x their mean",
            "pair_bins": "the 2-way tables use the 1-way marginals' bins",
            "select": "the released rows are always chosen to match the DP margins, the former 'balanced'",
            "label_temperature": "noise on the label ranking measured no better"})

    @model_validator(mode="after")
    def _settings_they_need(self):
        if self.stratify is not None and not self.enabled:
            raise ValueError("generation.calibrate.stratify fixes values in the calibrated pool: set enabled: true")
        columns = self.stratify_columns
        named_none = self.stratify is not None and not columns and not self.auto_stratify  # e.g. []
        if len(columns) > 2 or len(set(columns)) < len(columns) or named_none:
            raise ValueError("generation.calibrate.stratify: one column, or two different ones (the DP tables are "
                             f"1- and 2-way), got {self.stratify}")
        if self.auto_stratify and not self.pairs_with_sensitive:
            raise ValueError("generation.calibrate.stratify 'auto' picks a proxy from the DP (column, A) tables: set "
                             "pairs_with_sensitive: true")
        if self.labels == "dp_tables" and not self.pairs_with_target:
            raise ValueError("generation.calibrate.labels 'dp_tables' reads the DP (column, target) tables: set "
                             "pairs_with_target: true")
        return self

    @property
    def auto_stratify(self) -> bool:
        """``stratify: auto``: the run chooses the columns from its DP tables (``tabular.strata``)."""
        return self.stratify == "auto"

    @property
    def stratify_columns(self) -> tuple[str, ...]:
        """``stratify`` as a tuple of column names (empty: off, or ``auto`` before the run chose)."""
        if self.auto_stratify:
            return ()
        return (self.stratify,) if isinstance(self.stratify, str) else tuple(self.stratify or ())


class GenerationSettings(StrictConfig):
    num_rows: Annotated[int, OUTPUT_ROWS_CAP] = Field(1000, ge=1)
    batch_size: Annotated[int, BATCH_CAP] = Field(64, ge=1)
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_attempts_factor: Annotated[float, cap(100, 'generation attempts per wanted row')] = Field(4.0, ge=1)
    seed: int = 0
    fairness: FairGenerationSettings = Field(default_factory=FairGenerationSettings)
    calibrate: CalibrationSettings = Field(default_factory=CalibrationSettings)


class DataSettings(RecordLevelData):
    """The private table and the real test table (owner-side evaluation only)."""

    source: str = "adult"  # "adult" or a CSV/JSONL/Parquet path (`path: FILE` says the same)
    test_path: str | None = None  # for non-adult sources: the real test table
    # public expected size m of the private working set (secret Bernoulli draws); None = the whole file
    # key `n_records` (was `train_rows`): every method names the working-set size so (config/keys.py)
    train_rows: Annotated[int | None, RECORDS_CAP] = Field(None, ge=10, alias="n_records")
    # public share of the file's rows drawn into the working set; needed when your file has more rows than
    # train_rows (a rate train_rows / rows would depend on the file's size); adult: train_rows / its rows
    sample_fraction: float | None = Field(None, gt=0, le=1)
    test_rows: Annotated[int | None, RECORDS_CAP] = Field(None, ge=10)
    seed: int = 0  # post-processing and owner-side evaluation only (test subsample, TSTR models)
    # one file, no test file: hold out this many rows (a public count) as the owner-side test set, chosen
    # by a keyed hash of each row's content (privacy.randomness.content_keyed_holdout, key = seed); the
    # DP guarantee then covers the rest of the file
    holdout_rows: Annotated[int | None, RECORDS_CAP] = Field(None, ge=10)

    @model_validator(mode="after")
    def _one_test_source(self):
        if self.holdout_rows and self.test_path:
            raise ValueError("give data.test_path (a test file) or data.holdout_rows (split your one file), not both")
        if self.holdout_rows and self.source == "adult":
            raise ValueError("data.holdout_rows splits your own file; the adult source has its own test file")
        return self

    @model_validator(mode="before")
    @classmethod
    def _path_is_your_file(cls, data):
        """``data.path: FILE``, the key every other pipeline uses for your data file, as ``source: FILE``."""
        if isinstance(data, dict) and "path" in data:
            if "source" in data:
                raise ValueError("give data.path (your file) or data.source (adult), not both")
            data = {**{k: v for k, v in data.items() if k != "path"}, "source": data["path"]}
        return data


class BudgetSplit(StrictConfig):
    domain: float = Field(0.05, ge=0, lt=1)  # fraction of epsilon for `domain: dp` columns (if any)
    fair_stats: float = Field(0.05, ge=0, lt=1)  # fraction for the (A, Y) table (if fairness is on)
    # fraction for DP 1-way marginals of every column (for public_stage.rows_from: dp_marginals and/or
    # generation.calibrate)
    marginals: float = Field(0.0, ge=0, lt=1)


class SerializationSettings(StrictConfig):
    separator: str = ", "
    prefix: str = "names"
    random_order: bool = False


class PublicStageSettings(StrictConfig):
    """Stage 1: non-private LoRA fine-tuning on rows the pipeline draws without reading private rows,
    merged into the base model before DP-SGD (``tabular.public_stage``). 0 steps = off.

    rows_from: ``schema`` draws every column uniformly from the public schema (no budget);
    ``dp_marginals`` draws each column from its DP 1-way marginal (the ``marginals`` stage, charged
    to ``budget.marginals``), so the model starts from the right marginals and DP-SGD spends its
    steps on the dependencies between columns (an extension of the seed's stage 1)."""

    steps: int = Field(0, ge=0, le=10_000)
    rows_from: Literal["schema", "dp_marginals"] = "schema"
    marginal_bins: int = Field(8, ge=2, le=256)  # equal-width bins of a numeric column's DP marginal
    rows: int = Field(512, ge=1, le=1_000_000)
    batch_size: int = Field(16, ge=1, le=4096)
    learning_rate: float = Field(2e-3, gt=0)
    seed: int = 0  # which public rows and the stage-1 LoRA init (public, data-independent)

    @property
    def uses_dp_marginals(self) -> bool:
        """Stage 1 runs and draws its rows from the DP marginals (the ``marginals`` stage is needed)."""
        return self.rows_from == "dp_marginals" and self.steps > 0


class TrainingSettings(StrictConfig):
    model: str = "smollm2-135m-instruct"
    lora: LoraSettings = Field(default_factory=LoraSettings)
    steps: Annotated[int, STEPS_CAP] = Field(30, ge=1)
    expected_batch_size: Annotated[int, cap(1_000_000, 'expected records per DP-SGD step')] = Field(32, ge=1)
    physical_batch_size: Annotated[int, BATCH_CAP] = Field(16, ge=1)
    learning_rate: float = Field(2e-3, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    clipping: str = "ghost"
    max_seq_len: Annotated[int, SEQ_LEN_CAP] = Field(128, ge=16)
    seed: int = 0  # column order of the serialized rows (data-independent) and the LoRA init
    torch_threads: Annotated[int | None, THREADS_CAP] = Field(None, ge=1)  # None: the CPUs the stage was given
    public_stage: PublicStageSettings = Field(default_factory=PublicStageSettings)


class FairnessSettings(StrictConfig):
    """The training terms (``tabular.fairness``, ``tabular.fair_eo``), summed over ``sensitive``.

    lambda_dp: demographic-parity group shift; lambda_eo: the equalized-odds regularizer (its
    constants from rows the model being trained generates, ``eo_rows`` every ``eo_refresh_every``
    steps). Each weight is one number for every attribute or ``{attribute: weight}``.
    """

    lambda_dp: Weight = 0.0
    lambda_eo: Weight = 0.0
    sensitive: str | list[str] | None = None  # default: the schema's first sensitive attribute
    target_y: dict[str, float] | None = None  # public target P(Y); default: DP-estimated P(Y)
    eo_rows: int = Field(32, ge=4, le=4096)
    eo_refresh_every: int = Field(5, ge=1, le=10_000)

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, raw):
        return _refuse_removed(raw, "fairness", {
            "lambda_reweigh": "reweighing towards independence of Y and A, which no shipped config used; "
                              "lambda_dp and lambda_eo remain"})

    @model_validator(mode="after")
    def _check(self):
        _one_or_many(self.sensitive)
        for name in ("lambda_dp", "lambda_eo"):
            value = getattr(self, name)
            values = value.values() if isinstance(value, dict) else [value]
            if any(v < 0 for v in values):
                raise ValueError(f"fairness.{name}: weights must be >= 0")
            if isinstance(value, dict) and self.sensitive is not None and set(value) - set(self.attributes or []):
                raise ValueError(f"fairness.{name}: weights for {sorted(set(value) - set(self.attributes or []))}, "
                                 f"which are not in fairness.sensitive {self.attributes}")
        return self

    @property
    def attributes(self) -> list[str] | None:
        """``sensitive`` as a list (None: not given)."""
        return [self.sensitive] if isinstance(self.sensitive, str) else self.sensitive

    def weight(self, name: str, attribute: str) -> float:
        """lambda_<name> of one attribute (a shared number, or the attribute's entry, else 0)."""
        value = getattr(self, f"lambda_{name}")
        return float(value.get(attribute, 0.0)) if isinstance(value, dict) else float(value)

    def any_weight(self, name: str) -> bool:
        value = getattr(self, f"lambda_{name}")
        return any(v > 0 for v in (value.values() if isinstance(value, dict) else [value]))

    @property
    def enabled(self) -> bool:
        return any(self.any_weight(name) for name in ("dp", "eo"))


class TablePrivacy(StrictConfig):
    epsilon: float = Field(..., gt=0)  # .inf: a non-private reference run, only with not_private: true
    delta: float | None = Field(None, gt=0, lt=1)  # default min(1e-5, m^-1.1), m = the expected private rows


class TableRunConfig(ReferenceRunConfig):
    """What every tabular run shares: where the data and the public schema are, and the budget (epsilon = inf
    with ``not_private: true``: exact counts, no DP-SGD noise or clipping; ``ReferenceRunConfig``)."""

    name: str
    output_dir: RunDirPath  # a path or file:// URI; shared storage on a cluster
    schema_path: str = "configs/schemas/adult.yaml"
    columns: list[str] | None = None
    data: DataSettings = Field(default_factory=DataSettings)
    privacy: TablePrivacy
    budget: BudgetSplit = Field(default_factory=BudgetSplit)
    evaluate_privacy: bool = True  # DCR + membership inference in the owner-side report

    def epsilon_share(self, fraction: float) -> float:
        """A stage's share of epsilon (inf in a reference run, where inf x 0 would be nan)."""
        return math.inf if self.is_reference else self.epsilon * fraction

    def run_dir(self) -> Path:
        """``output_dir`` itself, absolute (a relative one is refused inside a submitted Ray job); ``name``
        only labels the run (the ledger's dataset name), as in every method."""
        return require_durable_run_dir(Path(self.output_dir), "output_dir")

    def former_run_dir(self) -> Path:
        """``output_dir/name``: where releases before the one run-location rule ran this config."""
        return self.run_dir() / self.name


class DpFairConfig(TableRunConfig):
    """DPFairLLM: DP-SGD LoRA fine-tuning on serialized rows with fairness terms; fair generation."""

    # training.device / generation.device (and dtype) are one placement: the model stage is one Ray task
    moved_keys: ClassVar[dict[str, str]] = {
        **TableRunConfig.moved_keys, **{f"{stage}.{key}": f"placement.{key}"
                                        for stage in ("training", "generation") for key in ("device", "dtype")}}

    name: str = "dpfair"
    output_dir: RunDirPath = Path("runs/dpfair")
    placement: PlacementSettings = Field(default_factory=PlacementSettings)  # train and generate (the model stage)
    # fair-v1 (the default): every key the config leaves out takes the frozen recipe's value
    # (tabular.recipe); none: the bare method, the plain field defaults below (building blocks, each off)
    recipe: Literal["fair-v1", "none"] = "fair-v1"
    serialization: SerializationSettings = Field(default_factory=SerializationSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    fairness: FairnessSettings = Field(default_factory=FairnessSettings)
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    evaluate_reference: bool = True  # also train the TSTR classifiers on the real sample (a reference row)
    use_ray: bool = True  # train + generate as a Ray task (False: in this process)
    resources: StageResources = Field(default_factory=lambda: StageResources(cpus=1, gpus=0))  # that Ray task

    @model_validator(mode="before")
    @classmethod
    def _recipe(cls, raw):
        if not isinstance(raw, dict):
            return raw
        from dpsynth_core.tabular.recipe import BARE, RECIPE, apply_recipe

        recipe = raw.get("recipe", RECIPE)
        if recipe is None or recipe == BARE:  # null: what a run saved before fair-v1 was the default means bare
            return {**raw, "recipe": BARE}
        if recipe != RECIPE:
            raise ValueError(f"recipe: '{recipe}' is not a recipe: '{RECIPE}' (the default) or '{BARE}' (the bare "
                             "method, every building block off)")
        return {**apply_recipe(raw), "recipe": RECIPE}

    @model_validator(mode="before")
    @classmethod
    def _baseline_moved(cls, raw):
        if isinstance(raw, dict) and "baseline" in raw:
            raise ValueError("'baseline' is no longer part of a DPFairLLM run (one release per run directory): "
                             "run the AIM baseline as its own run, `dpsynth run aim --config configs/aim_*.yaml`")
        return raw

    @property
    def needs_dp_marginals(self) -> bool:
        """Stage 1 draws its rows from the DP marginals, or generation is calibrated to them."""
        return self.training.public_stage.uses_dp_marginals or self.generation.calibrate.enabled

    @model_validator(mode="after")
    def _marginals_budget(self):
        wants = self.needs_dp_marginals
        if wants and self.budget.marginals <= 0:
            users = [name for name, on in (("training.public_stage.rows_from 'dp_marginals'", self.training.public_stage.uses_dp_marginals),
                                           ("generation.calibrate", self.generation.calibrate.enabled)) if on]
            raise ValueError(f"{' and '.join(users)} uses the DP marginals, which needs a share of epsilon: set "
                             "budget.marginals (e.g. 0.1)")
        if self.budget.marginals > 0 and not wants:
            raise ValueError("budget.marginals is only spent for training.public_stage.rows_from 'dp_marginals' "
                             "(with public_stage.steps > 0) or generation.calibrate: set it to 0 or use those marginals")
        if self.budget.domain + self.budget.fair_stats + self.budget.marginals >= 1:
            raise ValueError("budget: domain + fair_stats + marginals must leave a share of epsilon for DP-SGD (< 1)")
        return self


class AimConfig(TableRunConfig):
    """The AIM baseline (smartnoise-synth) as its own run: domain estimation, AIM, evaluation."""

    name: str = "aim"
    output_dir: RunDirPath = Path("runs/aim")
    bins: Annotated[int, cap(1024, 'bins per numeric column: AIM marginals grow with their product')] = Field(16, ge=2)  # equal-width bins of numeric columns over their (public or DP) bounds
    num_rows: Annotated[int, OUTPUT_ROWS_CAP] = Field(1000, ge=1)
    sample_seed: int = 0  # sampling rows from the fitted model (post-processing) and their shuffle


def load_dpfair_config(path: str | Path) -> DpFairConfig:
    return load_config(path, DpFairConfig)


def load_aim_config(path: str | Path) -> AimConfig:
    return load_config(path, AimConfig)
