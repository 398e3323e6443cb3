"""DPFairLLM privacy accounting: every look at the private table is in the ledger and the total
stays within the configured epsilon; bad configs stop before anything is written."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth_core.privacy import GaussianEvent, PrivacyLedger, calibrate_gaussian_noise
from dpsynth_core.tabular.dp_domain import dp_group_label_table, dp_marginals, estimate_domain
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
    resolved = estimate_domain(schema, adult_sample, epsilon=0.2, ledger=ledger)
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
    counts = dp_group_label_table(adult_sample, schema, "sex", epsilon=0.1, ledger=ledger)
    (entry,) = ledger.entries()
    assert entry.stage == "dp_fair_stats" and entry.epsilon <= 0.1 + 1e-6
    assert set(counts) == {"Female", "Male"} and all(set(v) == {"<=50K", ">50K"} for v in counts.values())
    assert all(v >= 0.5 for row in counts.values() for v in row.values())  # post-processed floor
    # noisy, not exact: sigma at eps 0.1 is large enough that the released table differs
    exact = pd.crosstab(adult_sample.sex, adult_sample.income)
    assert any(abs(counts[a][y] - exact.loc[a, y]) > 1e-6 for a in counts for y in counts[a])


def test_dp_marginals_are_charged_noisy_and_shape_stage_one_rows(tmp_path, adult_sample):
    """budget.marginals: one Gaussian histogram per column (K compositions, one ledger entry), noise
    from OS entropy (two releases of the same data differ), and stage 1's rows follow the released
    marginals instead of the schema's uniform draw (Adult is ~2/3 men; uniform rows are ~1/2)."""
    from dpsynth_core.tabular.public_stage import public_rows

    schema = load_schema(ADULT_SCHEMA).select(["age", "education", "sex", "hours_per_week", "income"])
    ledger = PrivacyLedger.create(tmp_path, "adult", 2.0, 1e-5)
    released = dp_marginals(adult_sample, schema, epsilon=0.5, ledger=ledger, bins=8)
    (entry,) = ledger.entries()
    assert entry.stage == "dp_marginals" and entry.epsilon <= 0.5 + 1e-6
    sigma = calibrate_gaussian_noise(0.5, 1e-5, compositions=5)
    assert entry.params == GaussianEvent(noise_multiplier=sigma, compositions=5).params()
    assert released["sex"]["values"] == ["Female", "Male"] and len(released["age"]["counts"]) == 8
    assert all(c >= 0 for m in released.values() for c in m["counts"])  # clamped: post-processing
    again = dp_marginals(adult_sample, schema, epsilon=0.5, ledger=ledger, bins=8)
    assert released["education"]["counts"] != again["education"]["counts"]  # fresh noise, not a seed
    true_men = (adult_sample.sex == "Male").mean()
    rows = public_rows(schema, 2000, seed=0, marginals=released)
    uniform = public_rows(schema, 2000, seed=0)
    schema.validate_frame(rows, "stage-1 rows")
    assert abs((rows.sex == "Male").mean() - true_men) < 0.05 and abs((uniform.sex == "Male").mean() - 0.5) < 0.05
    real_old = (adult_sample.age >= 60).mean()
    assert abs((rows.age >= 60).mean() - real_old) < abs((uniform.age >= 60).mean() - real_old)
    # a budget that cannot afford it is refused before the data are read
    small = PrivacyLedger.create(tmp_path / "small", "adult", 0.1, 1e-5)
    with pytest.raises(Exception, match="refused"):
        dp_marginals(adult_sample, schema, epsilon=0.5, ledger=small)
    assert small.entries() == []


def test_dp_pair_marginals_with_the_target_are_more_compositions_of_the_same_event(tmp_path, adult_sample):
    """calibrate.pairs_with_target: each column's 2-way histogram with the target is released beside the
    1-way ones, K - 1 more compositions in the one ledger entry; its cells sum like the data's."""
    from dpsynth_core.tabular.calibrate import pair_margins_from_dp

    schema = load_schema(ADULT_SCHEMA).select(["age", "education", "sex", "income"])
    ledger = PrivacyLedger.create(tmp_path, "adult", 4.0, 1e-5)
    released = dp_marginals(adult_sample, schema, epsilon=2.0, ledger=ledger, bins=8, pairs_with="income")
    (entry,) = ledger.entries()
    sigma = calibrate_gaussian_noise(2.0, 1e-5, compositions=4 + 3)
    assert entry.params == GaussianEvent(noise_multiplier=sigma, compositions=7).params()
    assert sorted(released["pairs"]) == ["age|income", "education|income", "sex|income"]
    sex = released["pairs"]["sex|income"]["counts"]  # (Female, Male) x (<=50K, >50K), row-major
    exact = pd.crosstab(adult_sample.sex, adult_sample.income).loc[["Female", "Male"], ["<=50K", ">50K"]].to_numpy().ravel()
    assert len(sex) == 4 and max(abs(a - b) for a, b in zip(sex, exact)) < 6 * sigma
    assert len(released["pairs"]["age|income"]["counts"]) == 16
    margins = {m.name: m for m in pair_margins_from_dp(released, schema, skip=("sex",))}
    assert sorted(margins) == ["age|income", "education|income"]
    # the margin's cells are the release's cells: the exact table's shares land where the counts say
    real = margins["age|income"].shares(adult_sample)
    assert np.abs(real - margins["age|income"].target).sum() / 2 < 0.1
    with pytest.raises(Exception, match="categorical"):
        dp_marginals(adult_sample, schema, epsilon=0.1, ledger=ledger, pairs_with="age")


def test_pair_tables_bin_numeric_columns_on_their_own_coarser_cells_at_the_same_cost(tmp_path, adult_sample):
    """calibrate.pair_bins: a numeric column's cells in the 2-way tables are coarser than its 1-way
    histogram's; the ledger charges the same event (the compositions do not change), and the table's
    consumers (raking margins, the labeller's score) read its own edges."""
    from dpsynth_core.tabular.calibrate import pair_margins_from_dp
    from dpsynth_core.tabular.labeller import naive_bayes_log_odds

    schema = load_schema(ADULT_SCHEMA).select(["age", "education", "sex", "income"])
    fine, coarse = (PrivacyLedger.create(tmp_path / name, "adult", 4.0, 1e-5) for name in ("fine", "coarse"))
    dp_marginals(adult_sample, schema, epsilon=2.0, ledger=fine, bins=8, pairs_with="income")
    released = dp_marginals(adult_sample, schema, epsilon=2.0, ledger=coarse, bins=8, pairs_with="income", pair_bins=3)
    (a,), (b,) = fine.entries(), coarse.entries()
    assert a.params == b.params and b.details["pair_bins"] == 3 and "pair_bins" not in a.details
    assert len(released["age"]["counts"]) == 8 and len(released["age"]["edges"]) == 9  # the 1-way histogram keeps its bins
    age = released["pairs"]["age|income"]
    assert len(age["counts"]) == 3 * 2 and np.allclose(age["edges"], np.linspace(schema.column("age").min,
                                                                                   schema.column("age").max, 4))
    assert "edges" not in released["pairs"]["education|income"]  # categorical columns keep their categories
    sigma = calibrate_gaussian_noise(2.0, 1e-5, compositions=4 + 3)
    edges = np.asarray(age["edges"])
    code = np.clip(np.searchsorted(edges, adult_sample.age.to_numpy(float), side="right") - 1, 0, 2)
    exact = pd.crosstab(code, adult_sample.income).reindex(columns=["<=50K", ">50K"], fill_value=0).to_numpy().ravel()
    assert max(abs(x - y) for x, y in zip(age["counts"], exact)) < 6 * sigma
    margin = {m.name: m for m in pair_margins_from_dp(released, schema)}["age|income"]
    assert len(margin.target) == 6 and np.abs(margin.shares(adult_sample) - margin.target).sum() / 2 < 0.1
    # the labeller's score takes one value per coarse age cell (education, sex held fixed)
    rows = adult_sample.assign(education=adult_sample.education.iloc[0], sex="Female")
    scores = naive_bayes_log_odds(rows, released, "income", ">50K")
    assert len(np.unique(np.round(scores, 9))) == len(np.unique(code))


def _tiny_config(tmp_path: Path, **over) -> Path:
    cfg = {
        "name": "t", "output_dir": str(tmp_path / "runs"), "schema_path": str(ADULT_SCHEMA),
        "columns": ["age", "education", "capital_loss", "race", "sex", "hours_per_week", "income"],
        "data": {"source": "adult", "train_rows": 160, "test_rows": 200, "seed": 0},
        "recipe": "none", "epsilon": 3.0, "budget": {"domain": 0.05, "fair_stats": 0.05, "marginals": 0.1},
        # stage 1 on rows drawn from DP 1-way marginals (the dp_marginals stage)
        "training": {"model": "tiny-llama", "steps": 2, "expected_batch_size": 16, "physical_batch_size": 16,
                     "learning_rate": 0.005, "max_seq_len": 64, "clipping": "hooks",
                     "public_stage": {"steps": 2, "rows": 32, "batch_size": 8, "rows_from": "dp_marginals"}},
        # two attributes; the equalized-odds term renews its constants from 4 generated rows at step 0
        "fairness": {"lambda_dp": {"sex": 1.0, "race": 0.5}, "lambda_eo": 0.5, "sensitive": ["sex", "race"], "eo_rows": 4},
        # a pool of 32 rows raked to the DP marginals (and to demographic parity), 16 of them released
        "generation": {"num_rows": 16, "batch_size": 16, "calibrate": {"enabled": True, "pool_factor": 2.0},
                       "fairness": {"enabled": True, "max_dp_gap": 0.2, "warmup_rows": 4, "tilt": True}},
        "evaluate_privacy": True, "use_ray": True,
    }
    cfg.update(over)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, adult_dir, ray_session):
    """One tiny DPFairLLM run through the Ray driver (real Ray), every task call recorded."""
    import ray_jobs.dpfair as dpfair
    from dpsynth_core.tabular.config import load_dpfair_config
    from dpsynth_core.tabular.pipeline import run_dpfair

    tmp = tmp_path_factory.mktemp("dpfair")
    path = _tiny_config(tmp)
    calls: list[tuple] = []

    def recording_runner(fn, *args):
        calls.append(args)
        return dpfair.ray_runner(fn, *args)

    run = run_dpfair(load_dpfair_config(path), runner=recording_runner)
    return run, path, calls


def test_pipeline_ledger_composes_within_epsilon(finished_run):
    """prepare (DP domain of capital_loss) + fair_stats + DP-SGD with the fairness penalty +
    generation: each stage in the ledger, composed total <= the configured epsilon."""
    from dpsynth_core.privacy import DpSgdEvent, calibrate_noise_multiplier

    run, _, _ = finished_run
    ledger = PrivacyLedger.open(run)
    stages = [e.stage for e in ledger.entries()]
    # stage 1 trains on rows drawn from the DP marginals: the marginals are charged, stage 1 itself is not
    assert stages == ["dp_domain", "dp_fair_stats", "dp_marginals", "dpsgd", "generate"]
    train = json.loads((run / "stages" / "train.done").read_text())
    assert train["public_stage"]["steps"] == 2 and train["base_model"].endswith("/model")
    marginals = json.loads((run / "dp_marginals.json").read_text())
    assert set(marginals) == {"age", "education", "capital_loss", "race", "sex", "hours_per_week", "income"}
    # its cached model is keyed by this run's release (another run's marginals give another model)
    assert json.loads((run / "public_stage.json").read_text())["settings"]["rows_from"] == "dp_marginals"
    assert [r["step"] for r in train["eo_refreshes"]] == [0]  # the EO constants, from rows generated before step 0
    assert (run / "release" / "public_stage.json").is_file()  # how to rebuild the adapter's base model
    by = {e.stage: e for e in ledger.entries()}
    assert by["dp_domain"].epsilon <= 3.0 * 0.05 + 1e-6 and by["dp_fair_stats"].epsilon <= 3.0 * 0.05 + 1e-6
    assert by["dp_marginals"].epsilon <= 3.0 * 0.1 + 1e-6 and by["dp_marginals"].event().compositions == 7
    # one (A, Y) table per sensitive attribute: one ledger entry of two compositions
    targets = json.loads((run / "release" / "fair_targets.json").read_text())["attributes"]
    assert [t["sensitive"] for t in targets] == ["sex", "race"] and by["dp_fair_stats"].event().compositions == 2
    assert by["generate"].epsilon == 0.0
    total = ledger.total_epsilon()
    assert 3.0 * 0.99 <= total <= 3.0 + 1e-9  # DP-SGD fills what composition leaves, never more
    assert total <= sum(e.epsilon for e in ledger.entries()) + 1e-9  # never worse than adding up
    # the fairness penalty does not change DP-SGD's accounting: a plain DpSgdEvent whose sigma is at
    # most the calibration to "what is left" by subtraction (fill_budget lowers it)
    ev = by["dpsgd"].event()
    assert isinstance(ev, DpSgdEvent) and ev.steps == 2
    q = ev.sampling_rate
    replay = PrivacyLedger.create(run.parent / "replay", "t", 3.0, ledger.delta)
    for e in ledger.entries()[:3]:
        replay.record(e.stage, e.event())
    sigma = calibrate_noise_multiplier(replay.remaining_epsilon() * 0.995, ledger.delta, q, 2)
    assert ev.noise_multiplier <= sigma * (1 + 1e-6)
    assert replay.projected_epsilon(ev) == pytest.approx(total, rel=1e-6)
    # outputs: synthetic rows all valid; schema with the DP-estimated capital_loss bounds
    resolved = json.loads((run / "schema_resolved.json").read_text())
    cl = next(c for c in resolved["columns"] if c["name"] == "capital_loss")
    assert cl["min"] is not None and 0 <= cl["min"] <= cl["max"] <= 10000
    gen = json.loads((run / "stages" / "generate.done").read_text())
    assert gen["valid_fraction"] == 1.0 and gen["invalid"] == 0
    # calibration is post-processing of the marginals already charged: the pool is raked, 16 rows released
    cal = gen["calibration"]
    assert cal["pool_rows"] == gen["attempted"] - gen["rejected"] == 32 and cal["rows"] == gen["rows"] == 16
    assert cal["tvd_to_dp_weighted"] <= cal["tvd_to_dp_pool"] + 1e-9
    assert len(pd.read_csv(run / "synthetic.csv")) == 16
    assert len(pd.read_csv(run / "generated_pool.csv")) == 32  # the pool, kept to re-calibrate without generating
    assert not (run / "release" / "generated_pool.csv").exists()
    ev_sum = json.loads((run / "stages" / "evaluate.done").read_text())
    for k in ("acc_lr", "f1_gb", "dp_diff_lr", "eo_diff_gb", "tvd_1way", "tvd_2way", "mia_auc",
              "dp_diff_lr_race", "eo_diff_gb_race", "aia_advantage_race"):
        assert k in ev_sum and ev_sum[k] == ev_sum[k]  # present, not NaN
    ref = json.loads((run / "stages" / "reference.done").read_text())
    assert ref["method"] == "real data" and 0.5 < ref["acc_lr"] <= 1.0
    assert "dpsgd" in (run / "ledger.txt").read_text()


def test_marginals_stage_releases_the_pairs_the_config_asks_in_one_entry(finished_run, tmp_path):
    """calibrate.pairs_with_target + pairs_with_sensitive through stages_dp.stage_marginals (on a copy of the
    finished run's working set, a fresh ledger): (column, income) for the 6 other columns and (column, sex)
    for the 5 others but income, 7 + 11 compositions of one charged event."""
    import shutil

    from dpsynth_core.tabular import stages_dp, stages_model
    from dpsynth_core.tabular.config import load_dpfair_config

    run, path, _ = finished_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy, ignore=shutil.ignore_patterns("ledger*", "dp_marginals.json"))
    cfg = load_dpfair_config(path)
    cal = cfg.generation.calibrate.model_copy(update={"pairs_with_target": True, "pairs_with_sensitive": True})
    cfg = cfg.model_copy(update={"generation": cfg.generation.model_copy(update={"calibrate": cal})})
    ledger = PrivacyLedger.create(copy, "t", 3.0, PrivacyLedger.open(run).delta)
    summary = stages_dp.stage_marginals(cfg, str(copy))
    assert summary["pairs_with"] == ["income", "sex"]
    pairs = json.loads((copy / stages_dp.MARGINALS_FILE).read_text())["pairs"]
    assert sorted(n for n in pairs if n.endswith("|sex")) == [
        "age|sex", "capital_loss|sex", "education|sex", "hours_per_week|sex", "race|sex"]
    assert len([n for n in pairs if n.endswith("|income")]) == 6
    (entry,) = ledger.entries()
    assert entry.stage == "dp_marginals" and entry.event().compositions == 18
    assert entry.epsilon <= 3.0 * 0.1 + 1e-6

def test_recalibrating_the_kept_pool_reproduces_the_run(finished_run):
    """experiments/dpfair_recalibrate.py re-applies the run's own calibration to generated_pool.csv: the
    released rows, evaluated as the evaluate stage does, give the run's own figures (so its variants
    measure what a run with those settings would release from the same pool)."""
    sys.path.insert(0, str(REPO / "experiments"))
    from dpfair_recalibrate import parse_variant, recalibrate

    run, _, _ = finished_run
    ev = json.loads((run / "stages" / "evaluate.done").read_text())
    again = recalibrate(run, {})
    for key in ("acc_lr", "f1_lr", "dp_diff_lr", "eo_diff_lr", "f1_gb", "tvd_1way", "tvd_2way"):
        assert again[key] == pytest.approx(ev[key]), key
    assert parse_variant("cut:label_cut=raked,label_temperature=1.5") == ("cut", {"label_cut": "raked", "label_temperature": 1.5})

def test_one_release_and_one_ledger_per_run_directory(finished_run):
    """Issue 12, Major 7: the AIM baseline is no longer a second full-epsilon release inside the run."""
    run, _, _ = finished_run
    assert [p.relative_to(run) for p in run.rglob("ledger.sqlite")] == [Path("ledger.sqlite")]
    tables = sorted(str(p.relative_to(run)) for p in run.rglob("*.csv"))
    # one table and its copy in release/; beside it the generated pool it was calibrated from (post-processing
    # of the same DP generator, not a second release)
    assert tables == ["generated_pool.csv", "release/synthetic.csv", "synthetic.csv"]
    manifest = json.loads((run / "release" / "MANIFEST.json").read_text())
    assert manifest["method"] == "dpfairllm" and manifest["epsilon"] == PrivacyLedger.open(run).total_epsilon()
    assert not (run / "baseline_aim").exists()


def test_ray_task_gets_config_and_paths_only(finished_run):
    """Issue 12, Major 8: nothing private in Ray task arguments; the worker reads its rows itself."""
    import pickle

    from dpsynth_core.tabular.config import DpFairConfig

    run, _, calls = finished_run
    assert len(calls) == 1  # train + generate: one Ray task
    (args,) = calls
    assert [type(a) for a in args] == [DpFairConfig, str] and Path(args[1]) == run.resolve()
    assert len(pickle.dumps(args)) < 20_000  # a config and a path, not a table
    assert json.loads((run / "stages" / "train.done").read_text())["steps"] == 2  # the task did train


def test_no_copy_of_the_private_table(finished_run):
    """No file in the run directory holds a run of consecutive private training rows (as CSV lines)."""
    from dpsynth_core.tabular.config import load_dpfair_config
    from dpsynth_core.tabular.run_schema import resolved_schema
    from dpsynth_core.tabular.private_data import load_private

    run, path, _ = finished_run
    private = load_private(load_dpfair_config(path), run, resolved_schema(run))
    lines = private.to_csv(index=False).splitlines()[1:]
    blocks = ["\n".join(lines[i : i + 3]) for i in range(0, len(lines) - 2, 3)]
    files = [f for f in run.rglob("*") if f.is_file()]
    assert files and not (run / "private").exists()
    for f in files:
        text = f.read_bytes().decode("utf-8", errors="ignore").replace("\r\n", "\n")
        leaked = [b for b in blocks if b in text]
        assert not leaked, f"{f.relative_to(run)} holds {len(leaked)} blocks of 3 consecutive private rows"
    # the secret subset (row indices) is owner-only state, outside release/
    state = run / "owner_only" / "private_subset.json"
    assert state.is_file() and (state.stat().st_mode & 0o077) == 0
    assert not any("private_subset" in str(p) for p in (run / "release").rglob("*"))


def test_rerun_finished_or_changed_config(finished_run, capsys):
    """Issue 19, item 1: a finished run says so and does nothing; a changed config is refused, naming
    the changed keys, and config.yaml keeps the epsilon the run was made with."""
    from dpsynth_core.errors import ConfigError
    from dpsynth_core.tabular.config import load_dpfair_config
    from dpsynth_core.tabular.pipeline import run_dpfair

    run, path, _ = finished_run
    cfg = load_dpfair_config(path)
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    n_entries = len(PrivacyLedger.open(run).entries())

    def refuse(fn, *args):
        raise AssertionError("a finished run must not run a stage again")

    assert run_dpfair(cfg, runner=refuse) == run
    assert "already finished" in capsys.readouterr().err
    assert run_dpfair(cfg.model_copy(update={"use_ray": False}), runner=refuse) == run  # execution-only key
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()} == before
    changed = cfg.model_copy(update={"privacy": cfg.privacy.model_copy(update={"epsilon": 1.0}),
                                     "data": cfg.data.model_copy(update={"train_rows": 150})})
    with pytest.raises(ConfigError, match=r"changed: data\.train_rows, privacy\.epsilon\).*--fresh"):
        run_dpfair(changed, runner=refuse)
    assert "epsilon: 3.0" in (run / "config.yaml").read_text()
    assert len(PrivacyLedger.open(run).entries()) == n_entries


@pytest.mark.parametrize(
    "override, message",
    [
        ({"columns": ["age", "salary", "income"]}, "unknown column 'salary'"),
        ({"fairness": {"lambda_dp": 1.0, "sensitive": "gender"}}, "unknown column 'gender'"),
        ({"fairness": {"lambda_dp": 1.0, "sensitive": ["sex", "gender"]}}, "unknown column 'gender'"),
        ({"fairness": {"lambda_dp": 1.0, "sensitive": ["sex", "sex"]}}, "distinct"),
        ({"fairness": {"lambda_dp": {"race": 1.0}}}, "fairness.lambda_dp"),  # default attribute: sex only
        ({"epsilon": -1}, "epsilon"),
        ({"baseline": {"aim": True}}, "dpsynth run aim"),
        ({"delta": 0.01}, "field 'privacy.delta'"),  # not below 1/m for m = 160 expected private rows
        ({"budget": {"marginals": 0.1}, "training": {"model": "tiny-llama"}, "generation": {"num_rows": 16}},
         "budget.marginals is only spent"),
        ({"budget": {"domain": 0.05}, "training": {"model": "tiny-llama", "public_stage": {
            "steps": 2, "rows_from": "dp_marginals"}}}, "needs a share of epsilon"),
        ({"budget": {"domain": 0.5, "fair_stats": 0.3, "marginals": 0.2}}, "must leave a share"),
        ({"generation": {"num_rows": 16, "calibrate": {"enabled": True}}, "training": {"model": "tiny-llama"},
          "budget": {"domain": 0.05, "fair_stats": 0.05}},
         "generation.calibrate uses the DP marginals"),
        ({"columns": ["age", "education", "income"], "fairness": {"lambda_dp": 0.0},
          "generation": {"num_rows": 16, "calibrate": {"enabled": True, "pairs_with_sensitive": True}}},
         "pairs_with_sensitive needs a sensitive attribute"),
        ({"generation": {"num_rows": 16, "calibrate": {"enabled": True, "stratify": "age"}}},
         "stratify: 'age' is not a categorical column"),
        ({"generation": {"num_rows": 16, "calibrate": {"stratify": "sex"}}}, "set enabled: true"),
        ({"generation": {"num_rows": 16, "calibrate": {"enabled": True, "stratify": ["sex", "race"]}}},
         "no DP 2-way table of"),
        ({"generation": {"num_rows": 16, "calibrate": {"enabled": True, "stratify": ["sex", "race", "education"]}}},
         "one column, or two different ones"),
        ({"fairness": {"lambda_dp": 0.0, "lambda_eo": 0.0},
          "generation": {"num_rows": 16, "fairness": {"enabled": True, "rate_mix": 0.5}}},
         "rate_mix reads the DP P"),
        ({"generation": {"num_rows": 16, "fairness": {"rate_mix": 0.5}}}, "rate_mix sets fair generation"),
        ({"generation": {"num_rows": 16, "fairness": {"enabled": True, "rate_mix": 0.5, "target_rates": {"Male": 0.2}}}},
         "generation.fairness.target_rates was removed"),
    ],
)
def test_bad_config_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys, override, message):
    from dpsynth.cli.main import app

    path = _tiny_config(tmp_path, **override)
    monkeypatch.setattr(sys, "argv", ["dpsynth", "run", "dpfair", "--config", str(path)])
    with pytest.raises(SystemExit) as exc:
        app()
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()  # nothing half-written


def test_bad_schema_file_through_the_cli(tmp_path, monkeypatch, capsys):
    from dpsynth.cli.main import app

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


def test_stratified_pool_quota_is_the_dp_marginal_of_the_column(finished_run):
    """calibrate.stratify: the quota generation fixes values by is the column's DP 1-way marginal (noisy
    counts clamped at 0), read from the run's dp_marginals.json: post-processing, nothing new charged."""
    from dpsynth_core.tabular import stages_dp, stages_model
    from dpsynth_core.tabular.config import load_dpfair_config

    run, path, _ = finished_run
    cfg = load_dpfair_config(path)
    assert stages_model._strata(cfg, run) is None  # off by default
    cal = cfg.generation.calibrate.model_copy(update={"stratify": "sex"})
    cfg = cfg.model_copy(update={"generation": cfg.generation.model_copy(update={"calibrate": cal})})
    entries = len(PrivacyLedger.open(run).entries())
    quota = stages_model._strata(cfg, run)
    dp = json.loads((run / stages_dp.MARGINALS_FILE).read_text())["sex"]
    counts = np.maximum(np.asarray(dp["counts"], float), 0)
    assert quota.columns == ("sex",)
    assert quota.shares == pytest.approx(dict(zip([(str(v),) for v in dp["values"]], counts / counts.sum())))
    assert [quota.next()["sex"] for _ in range(3)] and sum(quota.counts.values()) == 3
    assert len(PrivacyLedger.open(run).entries()) == entries


def test_rate_mix_targets_pool_every_dp_release_of_the_group_label_table(tmp_path, finished_run):
    """generation.fairness.rate_mix: explicit per-group target rates between parity and the DP
    P(Y | A), where the (A, Y) table is the least-squares pool of the fairness statistics' table and the
    marginals' releases of it, each weighted by the noise scale the ledger recorded for it; nothing new is
    charged; a fair_targets.json from before the counts were kept gives its own rates; without a mix the
    settings are the config's."""
    import shutil

    from dpsynth_core.tabular import stages_dp, stages_model
    from dpsynth_core.tabular.config import load_dpfair_config

    finished, path, _ = finished_run
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    cfg = load_dpfair_config(path)
    assert stages_model._generation_settings(cfg, run) is cfg.generation
    fair = cfg.generation.fairness.model_copy(update={"rate_mix": 0.5})
    cfg = cfg.model_copy(update={"generation": cfg.generation.model_copy(update={"fairness": fair})})
    sigma = {e.stage: e.details["sigma"] for e in PrivacyLedger.open(run).entries() if "sigma" in e.details}
    groups, labels = ["Female", "Male"], ["<=50K", ">50K"]

    def release(fair_table, marginal_table):  # replace both releases of the (sex, income) table
        targets = json.loads((run / "fair_targets.json").read_text())
        targets["attributes"][0]["counts"] = {a: dict(zip(labels, row)) for a, row in zip(groups, fair_table)}
        (run / "fair_targets.json").write_text(json.dumps(targets))
        marginals = json.loads((run / "dp_marginals.json").read_text())
        marginals["pairs"] = {"sex|income": {"columns": ["sex", "income"], "counts": np.ravel(marginal_table).tolist()}}
        marginals["sex"]["counts"] = np.sum(marginal_table, 1).tolist()
        marginals["income"]["counts"] = np.sum(marginal_table, 0).tolist()
        (run / "dp_marginals.json").write_text(json.dumps(marginals))

    def resolved():
        return stages_model._generation_settings(cfg, run).fairness.targets_for("sex", ["sex"])

    entries = len(PrivacyLedger.open(run).entries())
    table = np.array([[90.0, 10.0], [60.0, 40.0]])  # P(>50K | A): 0.1, 0.4; P(>50K) = 0.25
    release(table, table)  # releases that agree: their table
    assert resolved() == pytest.approx({"Female": (0.25 + 0.1) / 2, "Male": (0.25 + 0.4) / 2})
    disagree = np.array([[70.0, 30.0], [60.0, 40.0]])  # the fairness table says 0.3 for women, the marginals 0.1
    release(disagree, table)
    # weighted least squares over the four releases (2x2 tables, row and column sums), solved here with lstsq
    design = np.vstack([np.eye(4), np.eye(4), np.kron(np.eye(2), np.ones(2)), np.kron(np.ones(2), np.eye(2))])
    values = np.concatenate([disagree.ravel(), table.ravel(), table.sum(1), table.sum(0)])
    scale = np.repeat([1 / sigma["dp_fair_stats"], 1 / sigma["dp_marginals"]], [4, 8])
    cells = np.linalg.lstsq(design * scale[:, None], values * scale, rcond=None)[0].reshape(2, 2)
    overall = cells[:, 1].sum() / cells.sum()
    expect = {a: (overall + cells[i, 1] / cells[i].sum()) / 2 for i, a in enumerate(groups)}
    assert resolved() == pytest.approx(expect)
    assert (0.25 + 0.1) / 2 < expect["Female"] < (0.35 + 0.3) / 2  # between the two answers
    assert stages_model._generation_settings(cfg, run).fairness.rate_mix == 0.0  # resolved once: the stages read the rates
    assert len(PrivacyLedger.open(run).entries()) == entries

    targets = json.loads((run / "fair_targets.json").read_text())  # written before counts were kept
    del targets["attributes"][0]["counts"]
    (run / "fair_targets.json").write_text(json.dumps(targets))
    own = targets["attributes"][0]
    assert resolved() == pytest.approx({a: (own["target_y"][">50K"] + own["group_rates"][a][">50K"]) / 2 for a in groups})


def test_two_column_strata_come_from_the_released_2way_table(tmp_path, finished_run):
    """stratify: [sex, race] with pairs_with_sensitive: the quota's cells are the DP (race, sex) table's
    (named in the config's order whichever way the table is stored); a run whose marginals lack the
    table is refused rather than stratified by something else."""
    from dpsynth_core.errors import ConfigError
    from dpsynth_core.tabular import stages_dp, stages_model
    from dpsynth_core.tabular.config import load_dpfair_config

    _, path, _ = finished_run
    cfg = load_dpfair_config(path)
    cal = cfg.generation.calibrate.model_copy(update={"stratify": ["sex", "race"], "pairs_with_sensitive": True})
    cfg = cfg.model_copy(update={"generation": cfg.generation.model_copy(update={"calibrate": cal})})
    races, sexes = ["White", "Black", "Other"], ["Female", "Male"]
    counts = np.arange(6, dtype=float).reshape(3, 2) - 1.0  # one noisy negative cell, clamped to 0
    marginals = {"race": {"kind": "categorical", "values": races, "counts": counts.sum(1).tolist()},
                 "sex": {"kind": "categorical", "values": sexes, "counts": counts.sum(0).tolist()},
                 "pairs": {"race|sex": {"columns": ["race", "sex"], "counts": counts.ravel().tolist()}}}
    (tmp_path / stages_dp.MARGINALS_FILE).write_text(json.dumps(marginals))
    quota = stages_model._strata(cfg, tmp_path)
    assert quota.columns == ("sex", "race")
    positive = np.maximum(counts, 0)
    assert quota.shares == pytest.approx({(s, r): positive[i, j] / positive.sum()
                                          for i, r in enumerate(races) for j, s in enumerate(sexes)})
    assert quota.next() == {"sex": "Male", "race": "Other"}  # the largest cell first
    del marginals["pairs"]
    (tmp_path / stages_dp.MARGINALS_FILE).write_text(json.dumps(marginals))
    with pytest.raises(ConfigError, match="no 2-way table"):
        stages_model._strata(cfg, tmp_path)
