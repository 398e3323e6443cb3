"""DPFairLLM's (and AIM's) DP measurement stages: the working subset and `domain: dp` columns, the
fairness statistics, the DP marginals. Each takes (config, run dir) and returns a small JSON summary."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from dpsynth_core.run_loop.reserve import adopt_reservations
from dpsynth_core.runs.files import atomic_write_text
from dpsynth_core.tabular import private_data
from dpsynth_core.tabular.config import DpFairConfig, TableRunConfig
from dpsynth_core.tabular.run_schema import (
    pair_anchors, pair_attributes, public_schema, resolved_schema, sensitive_columns,
)
from dpsynth_core.tabular.schema import TableSchema

MARGINALS_FILE = "dp_marginals.json"
RESOLVED_CONFIG = "resolved_config.yaml"  # the config as the run resolved it (public: no private value)


def run_ledger(root: Path):
    from dpsynth_core.privacy import PrivacyLedger

    return PrivacyLedger.open(root)


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    atomic_write_text(path, frame.to_csv(index=False))


# ---- stages: each takes (config, run dir) and returns a small JSON summary (no private value) -----
def stage_prepare(cfg: DpFairConfig, root: str) -> dict:
    """Draw the working subset; DP bounds / categories for `domain: dp` columns (+ "other" buckets)."""
    return prepare_domain(cfg, Path(root), public_schema(cfg))


def prepare_domain(cfg: TableRunConfig, run: Path, schema: TableSchema) -> dict:
    """The first stage of a tabular run: the secret working subset, then `domain: dp` columns under DP."""
    from dpsynth_core.tabular.dp_domain import estimate_domain

    ledger = run_ledger(run)
    adopt_reservations(ledger, run, "prepare")  # a reservation the run loop made for this stage (AIM plans it)
    raw = private_data.private_rows(cfg, run, first_stage=True)
    resolved = estimate_domain(schema, raw, epsilon=cfg.epsilon_share(cfg.budget.domain), ledger=ledger)
    resolved = resolved.with_other_buckets()  # post-processing of the DP output
    resolved.validate_frame(raw, private_data.source_name(cfg))  # cannot fail after preflight: checked, not spent
    atomic_write_text(run / "schema_resolved.json", resolved.model_dump_json(indent=2))
    return {"columns": resolved.names}


def stage_fair_stats(cfg: DpFairConfig, root: str) -> dict:
    """Fairness targets t = P(Y), r, w per sensitive attribute from DP histograms of the public |A| x |Y| grids."""
    from dpsynth_core.tabular.dp_domain import dp_group_label_tables
    from dpsynth_core.tabular.fairness import FairnessTargets, dump_targets

    run, ledger = Path(root), run_ledger(Path(root))
    adopt_reservations(ledger, run, "fair_stats")  # the loop reserved plan_fair_stats' event: recorded against it
    schema = resolved_schema(run)
    attributes = sensitive_columns(cfg, schema)
    private = private_data.load_private(cfg, run, schema)
    counts = dp_group_label_tables(private, schema, attributes, epsilon=cfg.epsilon_share(cfg.budget.fair_stats), ledger=ledger)
    targets = [FairnessTargets.from_counts(counts[a], a, target_y=cfg.fairness.target_y) for a in attributes]
    atomic_write_text(run / "fair_targets.json", dump_targets(targets))
    return {"sensitive": attributes}


def stage_marginals(cfg: DpFairConfig, root: str) -> dict:
    """DP 1-way marginals of every column: stage 1's rows (``public_stage.rows_from: dp_marginals``) and
    the targets of ``generation.calibrate``."""
    from dpsynth_core.tabular.dp_domain import dp_marginals

    run, ledger = Path(root), run_ledger(Path(root))
    adopt_reservations(ledger, run, "marginals")  # the loop reserved plan_marginals' event: recorded against it
    schema = resolved_schema(run)
    private = private_data.load_private(cfg, run, schema)
    pairs_with = pair_anchors(cfg, schema)
    marginals = dp_marginals(private, schema, epsilon=cfg.epsilon_share(cfg.budget.marginals), ledger=ledger,
                             bins=cfg.training.public_stage.marginal_bins, pairs_with=pairs_with)
    atomic_write_text(run / MARGINALS_FILE, json.dumps(marginals, indent=1))
    strata = run_strata(cfg, run, schema)
    write_resolved_config(cfg, run)
    return {"columns": [c for c in marginals if c != "pairs"], **({"pairs_with": pairs_with} if pairs_with else {}),
            **({"stratify": list(strata)} if strata else {})}


# ---- plans: each DP stage's Gaussian histograms, reserved by the run loop before any stage runs --------
# (``run_loop.reserve``). The counts come from the public schema: the stages' resolved schema differs only
# in the DP domain's categories and bounds, never in its columns, target or sensitive attributes.
def plan_domain(cfg: TableRunConfig, ledger, schema: TableSchema) -> list:
    """The DP domain's histograms, one per unresolved `domain: dp` column of ``schema`` (none: nothing spent)."""
    return _histograms("dp_domain", cfg, ledger, cfg.budget.domain,
                       sum(c.domain == "dp" and not c.resolved() for c in schema.columns))


def plan_prepare(cfg: DpFairConfig, ledger) -> list:
    return plan_domain(cfg, ledger, public_schema(cfg))


def plan_fair_stats(cfg: DpFairConfig, ledger) -> list:
    """One (A, Y) table per sensitive attribute (``dp_group_label_tables``)."""
    return _histograms("dp_fair_stats", cfg, ledger, cfg.budget.fair_stats,
                       len(sensitive_columns(cfg, public_schema(cfg))))


def plan_marginals(cfg: DpFairConfig, ledger) -> list:
    """One histogram per column and per 2-way table (``dp_marginals``)."""
    from dpsynth_core.tabular.dp_domain import marginal_pairs

    schema = public_schema(cfg)
    return _histograms("dp_marginals", cfg, ledger, cfg.budget.marginals,
                       len(schema.columns) + len(marginal_pairs(schema, pair_anchors(cfg, schema))))


def _histograms(stage: str, cfg: TableRunConfig, ledger, fraction: float, histograms: int) -> list:
    from dpsynth_core.privacy.gaussian_histogram import histogram_event

    share = cfg.epsilon_share(fraction)
    if cfg.is_reference or not histograms or share <= 0:  # nothing spent, or refused by the stage as before
        return []
    return [(stage, histogram_event(share, ledger.delta, histograms)[1])]


def released_tables(run: Path) -> tuple[dict, float]:
    """The run's released DP marginals and the noise sd its ledger recorded for them (last entry)."""
    marginals = json.loads((run / MARGINALS_FILE).read_text())
    sigma = [float(e.details["sigma"]) for e in run_ledger(run).entries()
             if e.stage == "dp_marginals" and "sigma" in e.details][-1]
    return marginals, sigma


def run_strata(cfg: DpFairConfig, run: Path, schema: TableSchema) -> tuple[str, ...]:
    """The columns generation fixes per row: ``calibrate.stratify`` as given, or with ``auto`` chosen from
    the run's released DP tables (``tabular.strata``; post-processing)."""
    if not cfg.generation.calibrate.auto_stratify:
        return cfg.generation.calibrate.stratify_columns
    return strata_from_tables(cfg, schema, *released_tables(run))


def strata_from_tables(cfg: DpFairConfig, schema: TableSchema, marginals: dict, sigma: float) -> tuple[str, ...]:
    """``stratify: auto`` resolved on released tables (noise sd ``sigma``): the enforced attributes and the
    proxy among the run's other categorical columns (not the target, not a sensitive one of the schema)."""
    from dpsynth_core.tabular.strata import choose_strata

    attributes = pair_attributes(cfg, schema)
    candidates = [c.name for c in schema.columns if c.is_categorical and c.name != schema.target
                  and c.name not in schema.sensitive and c.name not in attributes]
    return choose_strata(marginals, attributes, candidates, sigma)


def column_order(cfg: DpFairConfig, schema: TableSchema, strata: tuple[str, ...]) -> list[str]:
    """The order the rows are written in: with ``stratify: auto`` its columns first, so the rest of a row
    is written given them; otherwise the config's ``columns``."""
    if not cfg.generation.calibrate.auto_stratify:
        return schema.names
    return list(strata) + [c for c in schema.names if c not in strata]


def run_column_order(cfg: DpFairConfig, run: Path, schema: TableSchema) -> list[str]:
    """:func:`column_order` of a run (its strata from its tables)."""
    return column_order(cfg, schema, run_strata(cfg, run, schema))


def resolved_with_tables(cfg: DpFairConfig, schema: TableSchema, marginals: dict, sigma: float) -> dict:
    """The config as a run with these released tables resolves it: ``stratify: auto`` and the column order
    chosen, every default and recipe value filled in (public config only)."""
    resolved = cfg.model_dump(mode="json", by_alias=True)
    if cfg.generation.calibrate.auto_stratify:
        strata = strata_from_tables(cfg, schema, marginals, sigma)
        resolved["columns"] = column_order(cfg, schema, strata)
        resolved["generation"]["calibrate"]["stratify"] = list(strata)
    return resolved


def resolved_config(cfg: DpFairConfig, run: Path | None = None) -> dict:
    """The config as a run resolves it; without a run (or before its marginals stage) ``stratify: auto``
    stays ``auto``: it is chosen from the run's own DP tables."""
    if run is None or not cfg.generation.calibrate.auto_stratify or not (Path(run) / MARGINALS_FILE).is_file():
        return cfg.model_dump(mode="json", by_alias=True)
    return resolved_with_tables(cfg, resolved_schema(Path(run)), *released_tables(Path(run)))


def write_resolved_config(cfg: DpFairConfig, run: Path) -> None:
    """``resolved_config.yaml`` in the run directory (:func:`resolved_config` of the run)."""
    import yaml

    atomic_write_text(run / RESOLVED_CONFIG, yaml.safe_dump(resolved_config(cfg, run), sort_keys=False))
