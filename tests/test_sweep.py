"""A 2-trial public Tune sweep of ACTG on tiny-llama completes, reports and plots (DP sweeps on private
data: tests/test_sweep_private.py)."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from dpsynth_core.config import load_config
from ray_jobs.sweep import SweepConfig, run


def test_two_trial_sweep_on_tiny_llama(ray_session, tmp_path):
    raw = yaml.safe_load(open("configs/sweep_actg_tiny.yaml"))
    raw["output_dir"] = str(tmp_path / "sweep")
    # the ranking metric is IFAcc: the owner-side MAUVE / classifier reports only cost time here, and
    # so do AIM's 2-way marginals (a 1-way workload is still AIM under the trial's eps1; the full
    # pipeline is tested in test_actg_pipeline.py); one RL step still makes the after_rl figure ranked on, and
    # one DP-SGD step still trains the generator under the trial's eps2
    raw["overrides"] = {"evaluation.mauve": False, "evaluation.classifier": False, "features.options.degree": 1,
                        "rl.steps": 1, "generator.steps": 1}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(raw))
    summary = run(load_config(path, SweepConfig))

    assert summary["num_trials"] == 2 and summary["failed_trials"] == 0
    assert set(summary["best_config"]) == {"privacy.features_share", "rl.gamma0"}
    results = pd.read_csv(tmp_path / "sweep" / "results.csv")
    assert len(results) == 2 and results["ifacc.after_rl"].between(0, 1).all()
    # (CSV round trip: compare to the float tolerance)
    assert summary["best_metric"]["ifacc.after_rl"] == pytest.approx(results["ifacc.after_rl"].max())
    # each trial is a full pipeline run with its own ledger and metrics, at its own eps split
    shares = set()
    for run_dir in results["run_dir"]:
        metrics = json.loads(open(f"{run_dir}/metrics.json").read())
        assert "ifacc" in json.dumps(metrics)
        trial_cfg = yaml.safe_load(open(f"{run_dir}.yaml"))
        shares.add(trial_cfg["privacy"]["features_share"])
    assert len(shares) == 2
    assert (tmp_path / "sweep" / "sweep.json").is_file() and (tmp_path / "sweep" / "sweep.png").is_file()
