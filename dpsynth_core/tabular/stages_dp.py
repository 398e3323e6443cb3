"""DPFairLLM's (and AIM's) DP measurement stages: the working subset and `domain: dp` columns, the
fairness statistics, the DP marginals. Each takes (config, run dir) and returns a small JSON summary."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from dpsynth_core.runs.files import atomic_write_text
from dpsynth_core.tabular import private_data
from dpsynth_core.tabular.config import DpFairConfig, TableRunConfig
from dpsynth_core.tabular.run_schema import pair_anchors, public_schema, resolved_schema, sensitive_columns
from dpsynth_core.tabular.schema import TableSchema

MARGINALS_FILE = "dp_marginals.json"


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

    raw = private_data.private_rows(cfg, run, first_stage=True)
    resolved = estimate_domain(schema, raw, epsilon=cfg.epsilon_share(cfg.budget.domain), ledger=run_ledger(run))
    resolved = resolved.with_other_buckets()  # post-processing of the DP output
    resolved.validate_frame(raw, private_data.source_name(cfg))  # cannot fail after preflight: checked, not spent
    atomic_write_text(run / "schema_resolved.json", resolved.model_dump_json(indent=2))
    return {"columns": resolved.names}


def stage_fair_stats(cfg: DpFairConfig, root: str) -> dict:
    """Fairness targets t = P(Y), r, w per sensitive attribute from DP histograms of the public |A| x |Y| grids."""
    from dpsynth_core.tabular.dp_domain import dp_group_label_tables
    from dpsynth_core.tabular.fairness import FairnessTargets, dump_targets

    run = Path(root)
    schema = resolved_schema(run)
    attributes = sensitive_columns(cfg, schema)
    private = private_data.load_private(cfg, run, schema)
    counts = dp_group_label_tables(private, schema, attributes, epsilon=cfg.epsilon_share(cfg.budget.fair_stats), ledger=run_ledger(run))
    targets = [FairnessTargets.from_counts(counts[a], a, target_y=cfg.fairness.target_y) for a in attributes]
    atomic_write_text(run / "fair_targets.json", dump_targets(targets))
    return {"sensitive": attributes}


def stage_marginals(cfg: DpFairConfig, root: str) -> dict:
    """DP 1-way marginals of every column: stage 1's rows (``public_stage.rows_from: dp_marginals``) and
    the targets of ``generation.calibrate``."""
    from dpsynth_core.tabular.dp_domain import dp_marginals

    run = Path(root)
    schema = resolved_schema(run)
    private = private_data.load_private(cfg, run, schema)
    pairs_with = pair_anchors(cfg, schema)
    marginals = dp_marginals(private, schema, epsilon=cfg.epsilon_share(cfg.budget.marginals), ledger=run_ledger(run),
                             bins=cfg.training.public_stage.marginal_bins, pairs_with=pairs_with,
                             pair_bins=cfg.generation.calibrate.pair_bins)
    atomic_write_text(run / MARGINALS_FILE, json.dumps(marginals, indent=1))
    return {"columns": [c for c in marginals if c != "pairs"], **({"pairs_with": pairs_with} if pairs_with else {})}

