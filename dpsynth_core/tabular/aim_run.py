"""The AIM baseline (smartnoise-synth) as a run of its own: one release, one ledger.

    dpsynth run aim --config configs/aim_eps4.yaml

It used to run inside a DPFairLLM run, which then held two full-epsilon releases of the same
sample. Here it is an ordinary run with the same data settings, schema and budget split:

    prepare    the secret working subset (owner-only state); `domain: dp` columns under DP
    aim        AIM under what the ledger leaves (zCDP rho)                -> synthetic.csv
    evaluate   TSTR / TVD / fairness / DCR+MIA on real data (owner-side report, not a release)
    release    release/: synthetic.csv, the DP schema, the ledger
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd

from dpsynth_core.runs import StageMarkers, announce_finished, open_run_dir
from dpsynth_core.runs.files import atomic_write_text
from dpsynth_core.runs.lock import locked_run
from dpsynth_core.tabular import private_data
from dpsynth_core.tabular.config import AimConfig
from dpsynth_core.tabular.pipeline import prepare_domain, resolved_schema
from dpsynth_core.tabular.schema import load_schema

STAGES = ["prepare", "aim", "evaluate", "release"]


def _ledger(run: Path):
    from dpsynth_core.privacy import PrivacyLedger

    return PrivacyLedger.open(run)


def stage_aim(cfg: AimConfig, run: Path) -> dict:
    from dpsynth_core.tabular.baseline import aim_synthesize

    schema, ledger = resolved_schema(run), _ledger(run)
    private = private_data.load_private(cfg, run, schema)
    synth = aim_synthesize(private, schema, epsilon=ledger.remaining_epsilon(), ledger=ledger, num_rows=cfg.num_rows,
                           bins=cfg.bins, seed=cfg.sample_seed)
    atomic_write_text(run / "synthetic.csv", synth.to_csv(index=False))
    return {"rows": len(synth)}


def stage_evaluate(cfg: AimConfig, run: Path) -> dict:
    from dpsynth_core.tabular.evaluate import evaluate_table, summary_row

    schema, ledger = resolved_schema(run), _ledger(run)
    synth = pd.read_csv(run / "synthetic.csv", keep_default_na=False)
    report = evaluate_table(synth, private_data.load_private(cfg, run, schema), private_data.load_test(cfg), schema,
                            out_dir=run / "eval", privacy=cfg.evaluate_privacy)
    sensitive = schema.sensitive[0] if schema.sensitive else None
    return {"method": "aim", "epsilon": ledger.total_epsilon(), "delta": ledger.delta, "valid_fraction": 1.0,
            **(summary_row(report, sensitive) if sensitive and schema.target else {})}


def stage_release(cfg: AimConfig, run: Path) -> dict:
    from dpsynth_core.runs.release import write_release

    ledger = _ledger(run)
    items = {"synthetic.csv": run / "synthetic.csv", "schema_resolved.json": run / "schema_resolved.json"}
    write_release(run, items, ledger=ledger, method="aim")
    atomic_write_text(run / "ledger.txt", ledger.render())
    return {"files": sorted(items)}


@locked_run(lambda cfg, **_: cfg.run_dir())  # one process per run (runs/lock.py)
def run_aim(cfg: AimConfig, *, resume: bool = True) -> Path:
    """Run every AIM stage not yet finished (in this process); return the run directory."""
    from dpsynth_core.privacy import PrivacyLedger

    schema = load_schema(cfg.schema_path).select(cfg.columns)
    rows, delta = private_data.preflight(cfg, schema)  # before anything is written
    root = open_run_dir(cfg.run_dir(), cfg.model_dump(mode="json"), resume=resume)
    marks = StageMarkers(root)
    if all(marks.done(s) for s in STAGES):
        announce_finished(root)
        return root
    if not (root / "ledger.sqlite").is_file():
        PrivacyLedger.create(root, cfg.name, cfg.epsilon, delta, public_size=private_data.expected_rows(cfg, rows))
    stages = {"prepare": lambda c, r: prepare_domain(c, r, schema), "aim": stage_aim, "evaluate": stage_evaluate,
              "release": stage_release}
    for name in STAGES:
        if not marks.done(name):
            t0 = time.perf_counter()
            summary = stages[name](cfg, root)
            marks.mark(name, {"seconds": round(time.perf_counter() - t0, 2), **summary})
    return root


def main(config_path: Path, resume: bool = True) -> Path:
    from dpsynth_core.tabular.config import load_aim_config

    return run_aim(load_aim_config(config_path), resume=resume)
