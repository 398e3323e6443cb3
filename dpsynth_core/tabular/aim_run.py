"""The AIM baseline (smartnoise-synth) as a run of its own: one release, one ledger.

    dpsynth run aim --config configs/aim_eps4.yaml

It used to run inside a DPFairLLM run, which then held two full-epsilon releases of the same
sample. Here it is an ordinary run with the same data settings, schema and budget split:

    prepare    the secret working subset (owner-only state); `domain: dp` columns under DP
    aim        AIM under what the ledger leaves (zCDP rho)                -> synthetic.csv
               (epsilon = inf, ``not_private: true``: the private rows resampled, no noise, marked)
    (release)  release/: synthetic.csv, the DP schema, the ledger (written by the run loop)
    evaluate   TSTR / TVD / fairness / DCR+MIA on real data (owner-side report, not a release)
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth_core.run_loop import run_method
from dpsynth_core.run_loop.reserve import adopt_reservations
from dpsynth_core.runs.contract import Method, PrivacyPlan, Stage
from dpsynth_core.runs.files import atomic_write_text
from dpsynth_core.tabular import private_data
from dpsynth_core.tabular.config import AimConfig
from dpsynth_core.tabular.run_schema import resolved_schema
from dpsynth_core.tabular.schema import load_schema
from dpsynth_core.tabular.stages_dp import plan_domain, prepare_domain

NO_NOISE_AIM = "AIM: the private rows resampled, no noise (epsilon = inf reference run)"


def _ledger(run: Path):
    from dpsynth_core.privacy import PrivacyLedger

    return PrivacyLedger.open(run)


def _schema(cfg: AimConfig):
    return load_schema(cfg.schema_path).select(cfg.columns)


def stage_prepare(cfg: AimConfig, root: str) -> dict:
    return prepare_domain(cfg, Path(root), _schema(cfg))


def plan_prepare(cfg: AimConfig, ledger) -> list:
    """The DP domain's Gaussian histograms, one per unresolved `domain: dp` column (none: nothing spent)."""
    return plan_domain(cfg, ledger, _schema(cfg))


def plan_aim(cfg: AimConfig, ledger) -> list:
    """AIM's zCDP rho for what the ledger will leave it (``aim_synthesize`` converts the same epsilon)."""
    from snsynth.utils import cdp_rho

    from dpsynth_core.privacy import ZCdpEvent

    return [] if cfg.is_reference else [("aim_baseline", ZCdpEvent(rho=float(cdp_rho(ledger.remaining_epsilon(),
                                                                                        ledger.delta))))]


def stage_aim(cfg: AimConfig, root: str) -> dict:
    from dpsynth_core.tabular.baseline import aim_synthesize

    run = Path(root)
    schema, ledger = resolved_schema(run), _ledger(run)
    adopt_reservations(ledger, run, "aim")  # the loop reserved AIM's rho: recorded against it
    private = private_data.load_private(cfg, run, schema)
    if cfg.is_reference:  # epsilon = inf: AIM's rho -> inf limit, the data's own rows
        synth = resample_rows(private, schema, cfg.num_rows, cfg.sample_seed, ledger)
        atomic_write_text(run / "synthetic.csv", synth.to_csv(index=False))
        return {"rows": len(synth), "not_private": NO_NOISE_AIM}
    synth = aim_synthesize(private, schema, epsilon=ledger.remaining_epsilon(), ledger=ledger, num_rows=cfg.num_rows,
                           bins=cfg.bins, seed=cfg.sample_seed)
    atomic_write_text(run / "synthetic.csv", synth.to_csv(index=False))
    return {"rows": len(synth)}


def resample_rows(private: pd.DataFrame, schema, num_rows: int, seed: int, ledger) -> pd.DataFrame:
    """``num_rows`` rows drawn with replacement from the private table (the config seed: a reference run has
    no privacy to protect); the ledger's "aim_baseline" stage is marked not private, nothing recorded.

    AIM cannot run without noise (its budget is a finite rho); as rho -> inf its model reproduces every
    measured marginal exactly, and the data's own joint distribution is that limit's best case."""
    ledger.mark_not_private("aim_baseline", NO_NOISE_AIM)
    picks = np.random.default_rng(seed).integers(0, len(private), size=num_rows)
    return schema.validate_frame(private[schema.names].iloc[picks].reset_index(drop=True), "resampled rows")


def stage_evaluate(cfg: AimConfig, root: str) -> dict:
    from dpsynth_core.tabular.evaluate import evaluate_table, summary_row

    run = Path(root)
    schema, ledger = resolved_schema(run), _ledger(run)
    synth = pd.read_csv(run / "synthetic.csv", keep_default_na=False)
    report = evaluate_table(synth, private_data.load_private(cfg, run, schema), private_data.load_test(cfg), schema,
                            out_dir=run / "eval", privacy=cfg.evaluate_privacy)
    sensitive = schema.sensitive[0] if schema.sensitive else None
    return {"method": "aim", "epsilon": None if cfg.is_reference else ledger.total_epsilon(), "delta": ledger.delta,
            **({"not_private": True} if not ledger.is_private else {}), "valid_fraction": 1.0,
            **(summary_row(report, sensitive) if sensitive and schema.target else {})}


class AimMethod(Method):
    """AIM on a table: its stages for the run loop (``run_loop``)."""

    kind = "aim"
    config: AimConfig

    def stages(self) -> list[Stage]:
        return [Stage("prepare", stage_prepare, records=("gaussian",), reads_private=True, plan=plan_prepare),
                Stage("aim", stage_aim, records=("zcdp",), reads_private=True, plan=plan_aim),
                Stage("evaluate", stage_evaluate, reads_private=True, after_release=True)]

    def run_dir(self) -> Path:
        return self.config.run_dir()

    def former_run_dir(self) -> Path:
        return self.config.former_run_dir()

    def privacy_plan(self) -> PrivacyPlan:
        return private_data.privacy_plan(self.config, _schema(self.config))

    def release_items(self, root: Path) -> dict[str, Path]:
        return {"synthetic.csv": root / "synthetic.csv", "schema_resolved.json": root / "schema_resolved.json"}


def run_aim(cfg: AimConfig, *, resume: bool = True) -> Path:
    """Run every AIM stage not yet finished (in this process); return the run directory."""
    return run_method(AimMethod(cfg), resume=resume).run_dir


def main(config_path: Path, resume: bool = True) -> Path:
    from dpsynth_core.tabular.config import load_aim_config

    return run_aim(load_aim_config(config_path), resume=resume)
