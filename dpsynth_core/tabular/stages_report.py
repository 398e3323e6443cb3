"""DPFairLLM's owner-side reports on real data (not a release): the evaluation and the real-data reference row."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from dpsynth_core.runs import StageMarkers
from dpsynth_core.runs.files import atomic_write_text
from dpsynth_core.tabular import private_data
from dpsynth_core.tabular.config import DpFairConfig
from dpsynth_core.tabular.run_schema import reported_schema, resolved_schema, sensitive_column
from dpsynth_core.tabular.stages_dp import run_ledger


def stage_evaluate(cfg: DpFairConfig, root: str) -> dict:
    """Owner-side report on real data (TSTR, TVD, fairness, DCR + MIA): not a DP release."""
    from dpsynth_core.tabular.evaluate import evaluate_table, summary_row

    run = Path(root)
    schema = reported_schema(cfg, resolved_schema(run))
    sensitive = sensitive_column(cfg, schema)
    private = private_data.load_private(cfg, run, schema)
    synth = pd.read_csv(run / "synthetic.csv", keep_default_na=False)
    report = evaluate_table(synth, private, private_data.load_test(cfg), schema, out_dir=run / "eval",
                            privacy=cfg.evaluate_privacy)
    ledger = run_ledger(run)
    # a reference run (epsilon = inf) states no epsilon, and says it is not private
    summary = {"method": "dpfairllm", "epsilon": None if cfg.is_reference else ledger.total_epsilon(),
               "delta": ledger.delta, **({"not_private": True} if not ledger.is_private else {}),
               "valid_fraction": StageMarkers(run).summary("generate")["valid_fraction"],
               **(summary_row(report, sensitive) if sensitive and schema.target else {})}
    # what `dpsynth tune` reports per trial (owner-side: computed on real rows, so a public sweep only)
    atomic_write_text(run / "metrics.json", json.dumps({k: v for k, v in summary.items() if k != "method"}, indent=2))
    return summary


def stage_reference(cfg: DpFairConfig, root: str) -> dict:
    """The TSTR classifiers trained on the real working set (owner-side, no release); its TVD row is a
    real holdout sample of the synthetic size vs the working set (the floor a perfect generator reaches)."""
    from dpsynth_core.tabular.evaluate import marginal_tvd, summary_row, tstr

    run = Path(root)
    schema = reported_schema(cfg, resolved_schema(run))
    sensitive = sensitive_column(cfg, schema)
    private = private_data.load_private(cfg, run, schema)
    real_test = schema.validate_frame(private_data.load_test(cfg), "real test")
    ref = {"tstr": tstr(private, real_test, schema, cfg.data.seed)}
    holdout = real_test.sample(min(len(real_test), cfg.generation.num_rows), random_state=cfg.data.seed)
    ref["fidelity"] = marginal_tvd(holdout, private, schema)
    return {"method": "real data", "epsilon": None, "valid_fraction": 1.0, **(summary_row(ref, sensitive) if sensitive else {})}

