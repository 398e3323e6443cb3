"""`dpsynth audit release` on AIM (issue 39): the audit passes an honest run that it could have failed,
and catches the two test-only breakages (noise off; 10 % of the private rows copied into the release).

The table is small and built here: two columns of 100 public categories (10,000 cells: AIM's workload keeps marginals of at most 10,000), the 2,000 private rows on the
first 10 of each, so a canary drawn over the schema's domain is a combination the data never holds.
m = 2,000 canaries with 30 "in" guesses can refute up to 2.2 > the claimed epsilon = 1; 150 released rows
keep AIM's chance repeats of a canary's cell rare, and leave the noise-off run's reproduced canaries (about
150 / 3,000 of the ~1,000 included) well above 30.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pandas as pd
import pytest
import yaml

from dpsynth.api.audit import AimTarget
from dpsynth_core.audit.release_run import run_release_audit
from dpsynth_core.audit.release_settings import ReleaseAuditSettings
from dpsynth_core.errors import ConfigError
from dpsynth_core.tabular.config import AimConfig

CATEGORIES = [f"c{i:03d}" for i in range(100)]
SETTINGS = {"canaries": 2000, "guesses_in": 30}


@pytest.fixture(scope="module")
def aim_config(tmp_path_factory) -> AimConfig:
    root = tmp_path_factory.mktemp("audit_release")
    schema = {"name": "shop", "columns": [{"name": "city", "type": "categorical", "categories": CATEGORIES},
                                          {"name": "item", "type": "categorical", "categories": CATEGORIES}]}
    (root / "schema.yaml").write_text(yaml.safe_dump(schema))
    rows = np.random.default_rng(0).integers(0, 10, size=(2000, 2))  # test data, not DP randomness
    pd.DataFrame({"city": [CATEGORIES[i] for i in rows[:, 0]], "item": [CATEGORIES[i] for i in rows[:, 1]]}).to_csv(
        root / "private.csv", index=False)
    return AimConfig.model_validate({
        "name": "shop", "output_dir": str(root / "runs"), "schema_path": str(root / "schema.yaml"),
        "data": {"path": str(root / "private.csv"), "test_path": str(root / "private.csv")},
        "privacy": {"epsilon": 1.0}, "num_rows": 150})


def _audit(config: AimConfig, tmp_path, mode: str):
    settings = ReleaseAuditSettings.model_validate({**SETTINGS, "mode": mode})
    work = tmp_path / "audit_run"
    result = run_release_audit(AimTarget(config), settings, work, allow_test_only=mode != "dp")
    assert not work.exists()  # the audit's run (its file of canaries, ledger, release) is deleted
    assert result.reached == result.included and 850 < result.included < 1150
    assert result.largest_reachable_bound > result.claimed_epsilon == 1.0  # the audit could fail
    return result


def test_dp_on_passes_an_audit_that_could_fail(aim_config, tmp_path):
    result = _audit(aim_config, tmp_path, "dp")
    assert result.ledger_private and result.ledger_epsilon <= 1.0 + 1e-9
    assert result.epsilon_lower_bound <= result.claimed_epsilon and result.status == "passed"


def test_dp_off_is_caught(aim_config, tmp_path):
    result = _audit(aim_config, tmp_path, "dp_off")
    assert not result.ledger_private and result.ledger_epsilon == float("inf")
    assert result.epsilon_lower_bound > result.claimed_epsilon and result.status == "failed"
    assert "NOT PRIVATE" in result.to_summary()["warning"]


def test_broken_release_is_caught(aim_config, tmp_path):
    # 10 released AIM rows: the ~100 copied canaries are the only rows that repeat a canary's cell, bar about one
    # chance hit of AIM's (150 rows left ~15 such hits among ~115 candidates for 30 guesses, 27 of which must be
    # right to refute epsilon = 1: 28 was seen twice)
    result = _audit(aim_config.model_copy(update={"num_rows": 10}), tmp_path, "broken_release")
    assert not result.ledger_private
    assert result.epsilon_lower_bound > result.claimed_epsilon and result.status == "failed"


def test_test_only_modes_are_refused_without_the_flag(aim_config, tmp_path, monkeypatch, capsys):
    from dpsynth.cli.main import app

    with pytest.raises(ConfigError, match="test-only"):
        run_release_audit(AimTarget(aim_config), ReleaseAuditSettings(mode="dp_off"), tmp_path / "a")
    path = tmp_path / "audit.yaml"
    path.write_text(yaml.safe_dump({"method": "aim", "run": aim_config.model_dump(mode="json", by_alias=True),
                                    "audit": {"mode": "broken_release"}, "output_dir": str(tmp_path / "out")}))
    monkeypatch.setattr(sys, "argv", ["dpsynth", "audit", "release", "--config", str(path)])
    with pytest.raises(SystemExit) as exc:
        app()
    assert exc.value.code == 2 and "--allow-test-only" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # refused before anything was written


def test_summary_states_the_claim_beside_the_bound(aim_config, tmp_path):
    from dpsynth_core.audit.release_run import ReleaseAuditResult, write_release_audit

    result = ReleaseAuditResult(method="aim", mode="dp", canaries=1000, included=500, reached=500, guesses=30,
                                correct=16, epsilon_lower_bound=0.0, claimed_epsilon=1.0, largest_reachable_bound=2.2,
                                delta=1e-5, confidence=0.95, ledger_epsilon=1.0, ledger_private=True, wall_seconds=1.0)
    summary = json.loads(write_release_audit(result, tmp_path / "release_audit.json").read_text())
    assert summary["status"] == "passed" and summary["false_alarm_rate"] == 0.05
    assert summary["claimed_epsilon"] == 1.0 and "lower bound" in summary["reading"]


def test_canaries_avoid_the_data_and_a_copy_outscores_a_near_miss():
    from dpsynth_core.audit.release_canaries import TableCanaries, TableColumn, TextCanaries

    rng = np.random.default_rng()
    design = TableCanaries([TableColumn("city", tuple(CATEGORIES[:20])), TableColumn("age", None, 17, 90, True)])
    data = pd.DataFrame({"city": CATEGORIES[:10], "age": list(range(20, 30))})
    canaries = design.draw(300, data, rng)
    keys = set(zip(canaries["city"], canaries["age"]))
    assert len(keys) == 300 and not keys & set(zip(data["city"], data["age"]))
    near_miss = canaries.iloc[[1]].assign(age=lambda f: np.where(f["age"] < 90, f["age"] + 1, f["age"] - 1))
    unrelated = canaries[~canaries["city"].isin(canaries["city"].iloc[:2])].iloc[[0]]
    scores = design.score(pd.concat([canaries.iloc[:2], unrelated]), pd.concat([canaries.iloc[[0]], near_miss]))
    assert scores[0] >= 1.0 > scores[1] > scores[2]  # copied row > one cell off by a year > unrelated

    texts = TextCanaries(words=5)
    secrets_ = texts.draw(50, ["an ordinary private abstract"], rng)
    assert len(set(secrets_)) == 50
    scores = texts.score(secrets_[:2], [f"Some text. {secrets_[0]} More.", "the access code is unknown"])
    assert scores[0] > 1.0 > 0.0 == scores[1]


def test_the_run_report_shows_the_release_audit_beside_the_claim():
    from types import SimpleNamespace

    from dpsynth_core.report.privacy import _audit

    figures: list = []
    audit = {"epsilon_lower_bound": 2.5, "canaries": 1000, "reached": 500, "guesses": 40, "correct": 40,
             "claimed_epsilon": 1.0, "status": "failed"}
    assert _audit(SimpleNamespace(audit=None, release_audit=audit), figures)  # a refuted claim is flagged
    (figure,) = figures
    assert figure.value == 2.5 and figure.reference == 1.0 and figure.reference_label == "claimed ε"
    assert "1000 canaries, 500 reached the mechanism, 40/40" in figure.n and figure.flag == "audit failed"
