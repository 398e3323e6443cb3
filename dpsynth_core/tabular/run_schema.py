"""A DPFairLLM run's schema: the public schema restricted to the run's columns and checked against its
fairness and calibration settings, its sensitive attributes, and the DP-resolved schema of a run
(``schema_resolved.json``). Read by the pipeline's stages and by the pre-flight."""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.errors import ConfigError
from dpsynth_core.tabular.config import DpFairConfig
from dpsynth_core.tabular.schema import TableSchema, load_schema


def public_schema(cfg: DpFairConfig) -> TableSchema:
    """The public schema restricted to the run's columns; fairness settings checked against it."""
    schema = load_schema(cfg.schema_path).select(cfg.columns)
    attributes = sensitive_columns(cfg, schema)
    if cfg.fairness.enabled and (not attributes or schema.target is None):
        raise ConfigError(f"{cfg.schema_path}: fairness terms need a sensitive column and a target in the schema")
    for a in attributes + cfg.generation.fairness.attributes(schema.sensitive):
        if not schema.column(a).is_categorical:
            raise ConfigError(f"fairness: sensitive attribute '{a}' must be a categorical column")
    if cfg.generation.calibrate.pairs_with_target and schema.target is None:
        raise ConfigError(f"{cfg.schema_path}: generation.calibrate.pairs_with_target needs a target in the schema")
    if cfg.generation.calibrate.pairs_with_sensitive and not pair_attributes(cfg, schema):
        raise ConfigError(f"{cfg.schema_path}: generation.calibrate.pairs_with_sensitive needs a sensitive attribute "
                          "among the run's columns")
    mixed = cfg.generation.fairness.attributes(schema.sensitive) if cfg.generation.fairness.rate_mix > 0 else []
    if mixed and not (cfg.fairness.enabled and set(mixed) <= set(sensitive_columns(cfg, schema))):
        raise ConfigError(f"generation.fairness.rate_mix reads the DP P(Y | A) of {mixed} from the fairness statistics: "
                          "enable fairness (lambda_dp / lambda_eo) for those attributes")
    if mixed and len(schema.column(schema.target).categories or []) != 2:
        raise ConfigError(f"generation.fairness.rate_mix needs a binary target; '{schema.target}' is not")
    strata = cfg.generation.calibrate.stratify_columns
    for column in strata:
        if column not in schema.names or not schema.column(column).is_categorical:
            raise ConfigError(f"generation.calibrate.stratify: '{column}' is not a categorical column of the run")
    if len(strata) == 2 and not set(strata) & set(pair_anchors(cfg, schema)):
        raise ConfigError(f"generation.calibrate.stratify: the run releases no DP 2-way table of {list(strata)}; one "
                          "of them must be the target (pairs_with_target: true) or a sensitive attribute "
                          "(pairs_with_sensitive: true)")
    if cfg.generation.calibrate.labels == "dp_tables" and len(schema.column(schema.target).categories or []) != 2:
        raise ConfigError(f"{cfg.schema_path}: generation.calibrate.labels 'dp_tables' needs a binary target; "
                          f"'{schema.target}' is not")
    for name in ("dp", "eo"):  # a per-attribute weight for an attribute the run does not use
        weight = getattr(cfg.fairness, f"lambda_{name}")
        if isinstance(weight, dict) and set(weight) - set(attributes):
            raise ConfigError(f"fairness.lambda_{name}: weights for {sorted(set(weight) - set(attributes))}, "
                              f"but the sensitive attributes are {attributes}")
    return schema


def sensitive_columns(cfg: DpFairConfig, schema: TableSchema) -> list[str]:
    """The attributes of the training terms: ``fairness.sensitive``, else the schema's first one."""
    return cfg.fairness.attributes or schema.sensitive[:1]


def reported_schema(cfg: DpFairConfig, schema: TableSchema) -> TableSchema:
    """``schema`` whose sensitive list also holds the run's fairness attributes: the metrics report
    DP / EO differences for each of them."""
    extra = [a for a in sensitive_columns(cfg, schema) + cfg.generation.fairness.attributes(schema.sensitive)
             if a not in schema.sensitive]
    return schema.model_copy(update={"sensitive": [*schema.sensitive, *dict.fromkeys(extra)]}) if extra else schema


def sensitive_column(cfg: DpFairConfig, schema: TableSchema) -> str | None:
    """The headline attribute of the summaries (every attribute is in them too)."""
    attributes = sensitive_columns(cfg, schema)
    return attributes[0] if attributes else None


def resolved_schema(root: Path) -> TableSchema:
    return TableSchema.model_validate_json((Path(root) / "schema_resolved.json").read_text())


def pair_attributes(cfg: DpFairConfig, schema: TableSchema) -> list[str]:
    """The sensitive attributes whose 2-way tables ``calibrate.pairs_with_sensitive`` releases: those fair
    generation enforces, else the schema's (categorical ones among the run's columns)."""
    fair = cfg.generation.fairness
    names = fair.attributes(schema.sensitive) if fair.enabled else list(schema.sensitive)
    return [a for a in names if a in schema.names and schema.column(a).is_categorical and a != schema.target]


def pair_anchors(cfg: DpFairConfig, schema: TableSchema) -> list[str]:
    """The columns whose 2-way table with every other column the marginals stage releases."""
    cal = cfg.generation.calibrate
    if not cal.enabled:
        return []
    return ([schema.target] if cal.pairs_with_target and schema.target else []) + \
        (pair_attributes(cfg, schema) if cal.pairs_with_sensitive else [])
