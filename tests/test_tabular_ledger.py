"""DPFairLLM privacy accounting: every look at the private table is in the ledger and the total
stays within the configured epsilon; bad configs stop before anything is written."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from dpsynth_core.privacy import GaussianEvent, PrivacyLedger, calibrate_gaussian_noise
from dpsynth_core.tabular.dp_domain import dp_group_label_table, estimate_domain
from dpsynth_core.tabular.schema import TableSchema, load_schema

REPO = Path(__file__).resolve().parent.parent
ADULT_SCHEMA = REPO / "configs" / "schemas" / "adult.yaml"


@pytest.fixture(scope="module")
def adult_sample(adult_dir):
    from dpsynth_core.data import load_adult

    return load_adult("train").sample(2000, random_state=0).reset_index(drop=True)


def test_domain_estimation_is_charged_and_stays_in_the_candidate_range(tmp_path, adult_sample):
    schema = load_schema(ADULT_SCHEMA).select(["age", "capital_loss", "fnlwgt", "sex", "income"])
    ledger = PrivacyLedger.create(tmp_path, "adult", 1.0, 1e-5)
    resolved = estimate_domain(schema, adult_sample, epsilon=0.2, ledger=ledger, seed=0)
    (entry,) = ledger.entries()
    assert entry.stage == "dp_domain" and entry.details["columns"] == ["capital_loss", "fnlwgt"]
    assert entry.epsilon <= 0.2 + 1e-6  # the two histograms compose to the stage's epsilon
    sigma = calibrate_gaussian_noise(0.2, 1e-5, compositions=2)
    assert entry.params == GaussianEvent(noise_multiplier=sigma, compositions=2).params()
    for name in ("capital_loss", "fnlwgt"):
        col, cand = resolved.column(name), schema.column(name)
        assert col.resolved() and cand.candidate_min <= col.min <= col.max <= cand.candidate_max
    assert resolved.column("age") == schema.column("age")  # public columns untouched, free
    # a schema with only public columns costs nothing and records nothing
    pub = schema.select(["age", "sex", "income"])
    assert estimate_domain(pub, adult_sample, epsilon=0.2, ledger=ledger) is pub
    assert len(ledger.entries()) == 1
    # a budget that cannot afford it is refused before the data are read
    small = PrivacyLedger.create(tmp_path / "small", "adult", 0.1, 1e-5)
    with pytest.raises(Exception, match="refused"):
        estimate_domain(schema, adult_sample, epsilon=0.5, ledger=small)
    assert small.entries() == []


def test_group_label_table_is_charged(tmp_path, adult_sample):
    schema = load_schema(ADULT_SCHEMA).select(["age", "sex", "income"])
    ledger = PrivacyLedger.create(tmp_path, "adult", 1.0, 1e-5)
    counts = dp_group_label_table(adult_sample, schema, "sex", epsilon=0.1, ledger=ledger, seed=0)
    (entry,) = ledger.entries()
    assert entry.stage == "dp_fair_stats" and entry.epsilon <= 0.1 + 1e-6
    assert set(counts) == {"Female", "Male"} and all(set(v) == {"<=50K", ">50K"} for v in counts.values())
    assert all(v >= 0.5 for row in counts.values() for v in row.values())  # post-processed floor
    # noisy, not exact: sigma at eps 0.1 is large enough that the released table differs
    exact = pd.crosstab(adult_sample.sex, adult_sample.income)
    assert any(abs(counts[a][y] - exact.loc[a, y]) > 1e-6 for a in counts for y in counts[a])


def _tiny_config(tmp_path: Path, **over) -> Path:
    cfg = {
        "name": "t", "output_dir": str(tmp_path / "runs"), "schema_path": str(ADULT_SCHEMA),
        "columns": ["age", "education", "capital_loss", "sex", "hours_per_week", "income"],
        "data": {"source": "adult", "train_rows": 160, "test_rows": 200, "seed": 0},
        "epsilon": 3.0, "budget": {"domain": 0.05, "fair_stats": 0.05},
        "training": {"model": "tiny-llama", "steps": 2, "expected_batch_size": 16, "physical_batch_size": 16,
                     "learning_rate": 0.005, "max_seq_len": 64, "clipping": "hooks"},
        "fairness": {"lambda_dp": 1.0, "lambda_eo": 0.5, "sensitive": "sex"},
        "generation": {"num_rows": 16, "batch_size": 16, "fairness": {"enabled": True, "max_dp_gap": 0.2, "warmup_rows": 4}},
        "baseline": {"aim": False}, "evaluate_privacy": True, "use_ray": False,
    }
    cfg.update(over)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return path


def test_pipeline_ledger_composes_within_epsilon(tmp_path, adult_dir):
    """prepare (DP domain of capital_loss) + fair_stats + DP-SGD with the fairness penalty +
    generation: each stage in the ledger, composed total <= the configured epsilon."""
    import ray_jobs.dpfair as dpfair
    from dpsynth_core.privacy import DpSgdEvent, calibrate_noise_multiplier

    run = dpfair.main(_tiny_config(tmp_path))
    ledger = PrivacyLedger.open(run)
    stages = [e.stage for e in ledger.entries()]
    assert stages == ["dp_domain", "dp_fair_stats", "dpsgd", "generate"]
    by = {e.stage: e for e in ledger.entries()}
    assert by["dp_domain"].epsilon <= 3.0 * 0.05 + 1e-6 and by["dp_fair_stats"].epsilon <= 3.0 * 0.05 + 1e-6
    assert by["generate"].epsilon == 0.0
    total = ledger.total_epsilon()
    assert 3.0 * 0.99 <= total <= 3.0 + 1e-9  # DP-SGD fills what composition leaves, never more
    assert total <= sum(e.epsilon for e in ledger.entries()) + 1e-9  # never worse than adding up
    # the fairness penalty does not change DP-SGD's accounting: a plain DpSgdEvent whose sigma is at
    # most the calibration to "what is left" by subtraction (fill_budget lowers it)
    ev = by["dpsgd"].event()
    assert isinstance(ev, DpSgdEvent)
    assert ev.sampling_rate == pytest.approx(16 / 160) and ev.steps == 2
    replay = PrivacyLedger.create(tmp_path / "replay", "t", 3.0, ledger.delta)
    for e in ledger.entries()[:2]:
        replay.record(e.stage, e.event())
    sigma = calibrate_noise_multiplier(replay.remaining_epsilon() * 0.995, ledger.delta, 16 / 160, 2)
    assert ev.noise_multiplier <= sigma * (1 + 1e-6)
    assert replay.projected_epsilon(ev) == pytest.approx(total, rel=1e-6)
    # outputs: synthetic rows all valid; schema with the DP-estimated capital_loss bounds
    resolved = json.loads((run / "schema_resolved.json").read_text())
    cl = next(c for c in resolved["columns"] if c["name"] == "capital_loss")
    assert cl["min"] is not None and 0 <= cl["min"] <= cl["max"] <= 10000
    gen = json.loads((run / "stages" / "generate.done").read_text())
    assert gen["valid_fraction"] == 1.0 and gen["invalid"] == 0
    ev_sum = json.loads((run / "stages" / "evaluate.done").read_text())
    for k in ("acc_lr", "f1_gb", "dp_diff_lr", "eo_diff_gb", "tvd_1way", "tvd_2way", "mia_auc"):
        assert k in ev_sum and ev_sum[k] == ev_sum[k]  # present, not NaN
    ref = json.loads((run / "stages" / "reference.done").read_text())
    assert ref["method"] == "real data" and 0.5 < ref["acc_lr"] <= 1.0
    assert "dpsgd" in (run / "ledger.txt").read_text()
    _assert_no_copy_of_the_private_table(run, dpfair.DpFairConfig.model_validate(json.loads((tmp_path / "cfg.json").read_text())))


def _assert_no_copy_of_the_private_table(run: Path, cfg) -> None:
    """No file in the run directory holds a run of consecutive private training rows (as CSV lines)."""
    import ray_jobs.dpfair as dpfair

    train, _ = dpfair._load_tables(cfg)
    private = TableSchema.model_validate_json((run / "schema_resolved.json").read_text()).validate_frame(train)
    lines = private.to_csv(index=False).splitlines()[1:]
    blocks = ["\n".join(lines[i : i + 3]) for i in range(0, len(lines) - 2, 3)]
    files = [f for f in run.rglob("*") if f.is_file()]
    assert files and not (run / "private").exists()
    for f in files:
        text = f.read_bytes().decode("utf-8", errors="ignore").replace("\r\n", "\n")
        leaked = [b for b in blocks if b in text]
        assert not leaked, f"{f.relative_to(run)} holds {len(leaked)} blocks of 3 consecutive private rows"


@pytest.mark.parametrize(
    "override, message",
    [
        ({"columns": ["age", "salary", "income"]}, "unknown column 'salary'"),
        ({"fairness": {"lambda_dp": 1.0, "sensitive": "gender"}}, "unknown column 'gender'"),
        ({"epsilon": -1}, "epsilon"),
    ],
)
def test_bad_config_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys, override, message):
    from dpsynth_core.cli.main import app

    path = _tiny_config(tmp_path, **override)
    monkeypatch.setattr(sys, "argv", ["dpsynth", "run", "dpfair", "--config", str(path)])
    with pytest.raises(SystemExit) as exc:
        app()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert not (tmp_path / "runs").exists()  # nothing half-written


def test_bad_schema_file_through_the_cli(tmp_path, monkeypatch, capsys):
    from dpsynth_core.cli.main import app

    bad = tmp_path / "schema.yaml"
    bad.write_text(textwrap.dedent("""
        target: income
        columns:
          - {name: age, type: integer, min: 90, max: 17}
          - {name: income, type: categorical, categories: ["<=50K", ">50K"]}
    """))
    path = _tiny_config(tmp_path, schema_path=str(bad), columns=["age", "income"])
    monkeypatch.setattr(sys, "argv", ["dpsynth", "run", "dpfair", "--config", str(path)])
    with pytest.raises(SystemExit) as exc:
        app()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "column 'age': min > max" in err
    assert not (tmp_path / "runs").exists()
