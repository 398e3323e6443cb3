"""DP randomness comes from OS entropy: the same config, data and seed give different noisy outputs.

On the old code every mechanism here drew from a config seed (dp_domain, dp_fair_stats: the
public ``cfg.data.seed``; AIM's selection: numpy's global RNG seeded with it), so two runs were
identical and the noise could be rebuilt by anyone holding ``config.yaml``.
"""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from dpsynth_core.privacy import PrivacyLedger, calibrate_gaussian_noise
from dpsynth_core.tabular.dp_domain import dp_group_label_table, estimate_domain
from dpsynth_core.tabular.schema import TableSchema

DELTA = 1e-5


def _ledger(path) -> PrivacyLedger:
    return PrivacyLedger.create(path, "toy", epsilon_budget=100.0, delta=DELTA)


def _borderline_domain_case(epsilon: float):
    """Every candidate category and every numeric bin holds round(3 sigma) rows: exactly at the
    keep threshold, so each is kept with probability ~1/2 -- the outcome shows the noise."""
    sigma = calibrate_gaussian_noise(epsilon, DELTA, compositions=2)
    per_cell = int(round(3 * sigma))
    cats = [f"c{i:02d}" for i in range(20)]
    schema = TableSchema(columns=[
        {"name": "kind", "type": "categorical", "domain": "dp", "candidate_categories": cats},
        {"name": "amount", "type": "numeric", "domain": "dp", "candidate_min": 0.0, "candidate_max": 64.0},
    ])
    amounts = np.repeat(np.arange(64) + 0.5, per_cell)  # per_cell rows in each of the 64 bins
    kinds = np.full(len(amounts), "not-a-candidate", dtype=object)
    kinds[: 20 * per_cell] = np.repeat(cats, per_cell)  # per_cell rows of each candidate category
    frame = pd.DataFrame({"kind": kinds, "amount": amounts})
    return schema, frame


def test_dp_domain_categorical_and_numeric_noise_differs_between_identical_runs(tmp_path):
    schema, frame = _borderline_domain_case(epsilon=1.0)
    outcomes = []
    for i in range(8):
        resolved = estimate_domain(schema, frame, epsilon=1.0, ledger=_ledger(tmp_path / f"r{i}"))
        outcomes.append((tuple(resolved.column("kind").categories), resolved.column("amount").min,
                         resolved.column("amount").max))
    # the same public seed used to give 8 identical outcomes; now the category lists differ
    # (20 coin flips each) and the numeric bounds move (all 8 equal: probability ~1e-5)
    assert len({o[0] for o in outcomes}) > 1
    assert len({o[1:] for o in outcomes}) > 1


def test_dp_fair_stats_noise_differs_between_identical_runs(tmp_path):
    schema = TableSchema(columns=[
        {"name": "sex", "type": "categorical", "categories": ["F", "M"]},
        {"name": "y", "type": "categorical", "categories": ["0", "1"]},
    ], sensitive=["sex"], target="y")
    frame = pd.DataFrame({"sex": ["F"] * 300 + ["M"] * 500, "y": (["0", "1"] * 400)})
    first = dp_group_label_table(frame, schema, "sex", epsilon=1.0, ledger=_ledger(tmp_path / "a"))
    second = dp_group_label_table(frame, schema, "sex", epsilon=1.0, ledger=_ledger(tmp_path / "b"))
    # noisy counts are released as integers: one cell may repeat by chance (~8 % at sigma 3.7), not all four
    assert first != second


def _selection_case():
    """A real mbi model and AIM's candidate set for 5 ternary columns (no model fitting needed)."""
    from mbi import Dataset, Domain, MarkovRandomField
    from mbi.clique_vector import CliqueVector
    from snsynth.aim.aim import compile_workload

    names = ["a", "b", "c", "d", "e"]
    domain = Domain(names, [3] * len(names))
    data = Dataset(pd.DataFrame(np.random.default_rng(1).integers(0, 3, size=(50, 5)), columns=names), domain)
    cliques = [(n,) for n in names] + list(itertools.combinations(names, 2))
    model = MarkovRandomField(potentials=CliqueVector.zeros(domain, cliques),
                              marginals=CliqueVector.from_projectable(data, cliques), total=50)
    candidates = compile_workload(list(itertools.combinations(names, 2)))
    answers = {cl: data.project(cl).datavector() for cl in candidates}
    return candidates, answers, model


def test_aim_selection_is_not_replayed_by_a_seeded_global_rng(monkeypatch):
    """AIM's exponential mechanism: with numpy's global RNG seeded identically before each fit (what
    features.py / baseline.py used to do with the config seed), two AIMs select differently.
    smartnoise's own selection is replayed exactly -- the control that shows what the seed did."""
    import snsynth.utils
    from snsynth.aim import AIMSynthesizer

    from dpsynth_core.privacy.aim import make_aim

    candidates, answers, model = _selection_case()
    eps = 1e-6  # near-uniform choice among 15 candidates: a pure test of the random draw

    def rounds(aim):
        np.random.seed(0)
        return [aim._worst_approximated(candidates, answers, model, eps, 1.0) for _ in range(8)]

    assert rounds(AIMSynthesizer(1.0, DELTA)) == rounds(AIMSynthesizer(1.0, DELTA))  # old behaviour
    assert rounds(make_aim(1.0, DELTA)) != rounds(make_aim(1.0, DELTA))

    # and the secret selection never reads numpy's global RNG (a tripwire in its place)
    class Tripwire:
        def choice(self, *a, **k):
            raise AssertionError("AIM selection drew from numpy's global RNG")

    monkeypatch.setattr(snsynth.utils, "prng", Tripwire())
    aim = make_aim(1.0, DELTA)
    rounds(aim)
    assert len(aim.selections) == 8


def _pe_runner(tmp_path, **cfg_over):
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.pe.runner import PERunner

    cfg = PEConfig(method="wasp", data={"source": "biorxiv", "classes": ["x", "y"]}, iterations=2, **cfg_over)
    ledger = PrivacyLedger.create(tmp_path, "pe", epsilon_budget=cfg.epsilon, delta=DELTA)
    return PERunner(cfg, [None], None, None, ledger, ["x", "y"]), ledger


def test_pe_histogram_noise_differs_between_identical_runs(tmp_path):
    votes = np.arange(12, dtype=float)
    (a, _), (b, _) = _pe_runner(tmp_path / "a"), _pe_runner(tmp_path / "b")
    noisy_a = a.mechanism.privatize(votes, a._noise_rng(1))
    noisy_b = b.mechanism.privatize(votes, b._noise_rng(1))
    assert np.all(noisy_a != noisy_b)


def test_pinned_pe_noise_seed_is_refused_outside_test_mode_and_marks_the_ledger(tmp_path, monkeypatch):
    from pydantic import ValidationError

    from dpsynth_core.pe.config import PEConfig

    monkeypatch.delenv("DPSYNTH_TEST_MODE", raising=False)
    with pytest.raises(ValidationError, match="noise_seed.*test-only"):
        PEConfig(method="wasp", data={"source": "biorxiv", "classes": ["x", "y"]}, noise_seed=7)

    monkeypatch.setenv("DPSYNTH_TEST_MODE", "1")
    runner, ledger = _pe_runner(tmp_path, noise_seed=7)
    runner._record_privacy()
    assert not ledger.is_private
    assert "noise_seed" in ledger.not_private_reasons()[0]["reason"]
    (vote,) = [e for e in ledger.entries() if e.stage == "wasp.topq_vote"]
    assert vote.details["noise"] == "pinned noise_seed (test only)"


@pytest.mark.parametrize("knob", ["sampling_seed", "stop_after_steps"])
def test_dpsgd_test_only_knobs_are_refused_by_the_config_validators_outside_test_mode(knob, monkeypatch, tmp_path):
    """ACTG's generator and DP-FT feature LM, and `dpsynth train`, refuse a pinned DP seed and a
    simulated crash when the config is loaded, unless DPSYNTH_TEST_MODE=1."""
    from pydantic import ValidationError

    from dpsynth_core.actg.pipeline import ActgConfig
    from dpsynth_core.dpsgd.train_job import TrainJobConfig

    train = {"model": "tiny-llama", "epsilon": 1.0, "steps": 2, knob: 1}
    job = {"data": {"path": str(tmp_path / "d.csv"), "text_column": "text"}, "train": train}
    monkeypatch.delenv("DPSYNTH_TEST_MODE", raising=False)
    with pytest.raises(ValidationError, match=f"generator.{knob}: test-only"):
        ActgConfig(generator={"model": "tiny-llama", "steps": 2, knob: 1})
    with pytest.raises(ValidationError, match=f"features.lm.{knob}: test-only"):
        ActgConfig(generator_mode="direct_prompt", features={"generator": "dp_ft", "lm": {knob: 1}})
    with pytest.raises(ValidationError, match=f"train.{knob}: test-only"):
        TrainJobConfig.model_validate(job)
    monkeypatch.setenv("DPSYNTH_TEST_MODE", "1")
    ActgConfig(generator={"model": "tiny-llama", "steps": 2, knob: 1})
    TrainJobConfig.model_validate(job)


def test_federated_pe_records_its_per_party_guarantee(tmp_path):
    from dpsynth_core.privacy import gaussian_epsilon

    runner, ledger = _pe_runner(tmp_path, federated_parties=4)
    runner._record_privacy()
    (vote,) = [e for e in ledger.entries() if e.stage == "wasp.topq_vote"]
    fed = vote.details["federated"]
    assert fed["parties"] == 4 and fed["secure_aggregation"] is False
    assert fed["party_noise_multiplier"] == pytest.approx(runner.noise_multiplier / 2)
    assert fed["epsilon_released_sum"] == pytest.approx(vote.epsilon, rel=1e-6)
    assert fed["epsilon_per_party_message"] == pytest.approx(gaussian_epsilon(runner.noise_multiplier / 2, 2, DELTA))
    assert fed["epsilon_per_party_message"] > 1.5 * vote.epsilon  # a single party's message is weaker


def test_pe_and_tabular_histograms_go_through_the_one_gaussian_histogram_module(monkeypatch, tmp_path):
    """dp_domain / fairness statistics / DP marginals (integer counts, released rounded) and the PE
    votes (real-valued) all draw their noise in privacy.gaussian_histogram, from OS entropy."""
    import pandas as pd

    import dpsynth_core.tabular.dp_domain as dp_domain
    from dpsynth_core.privacy import PrivacyLedger, gaussian_histogram
    from dpsynth_core.tabular.schema import TableSchema

    counts = np.array([3.0, 0.0, 7.0, 1.0])
    a, b = (gaussian_histogram.noisy_histogram(counts, 2.5, integer_counts=True) for _ in range(2))
    assert np.array_equal(a, np.rint(a)) and not np.array_equal(a, b)  # integers; fresh OS entropy each call
    votes = gaussian_histogram.noisy_histogram(counts * 0.75, 2.5, integer_counts=False)
    assert not np.array_equal(votes, np.rint(votes))

    calls = []
    real = gaussian_histogram.noisy_histogram

    def recording(values, sigma, rng=None, *, integer_counts):
        calls.append(integer_counts)
        return real(values, sigma, rng, integer_counts=integer_counts)

    monkeypatch.setattr(dp_domain, "noisy_histogram", recording)
    monkeypatch.setattr(gaussian_histogram, "noisy_histogram", recording)
    schema = TableSchema.model_validate({"name": "t", "target": "y", "columns": [
        {"name": "a", "type": "categorical", "categories": ["u", "v"]},
        {"name": "y", "type": "categorical", "categories": ["0", "1"]}]})
    frame = pd.DataFrame({"a": ["u", "v", "u"], "y": ["0", "1", "1"]})
    ledger = PrivacyLedger.create(tmp_path, "t", 8.0, 1e-5)
    dp_domain.dp_marginals(frame, schema, epsilon=1.0, ledger=ledger)
    dp_domain.dp_group_label_tables(frame, schema, ["a"], epsilon=1.0, ledger=ledger)
    gaussian_histogram.GaussianHistogram(2.0, 1.0).privatize(counts, np.random.default_rng())
    assert calls == [True, True, True, False]  # two marginals, one fairness table, one vote
    assert [e.kind for e in ledger.entries()] == ["gaussian", "gaussian"]


class _Draws:
    """A generator whose uniform draws are fixed per row (the same row gets the same draw in every file)."""

    def random(self, n):
        return np.random.default_rng(7).random(2000)[:n]


def test_the_working_set_rate_never_depends_on_the_private_files_size():
    """The measured cases: m/n made every row's inclusion depend on n (extra cost 4.5 at m = 1,000 of
    n = 1,001; 0.03 at m = 300 of n = 1,000). Now a file larger than m is refused without a public
    sample_fraction (naming the key, no count), and with one, adding a record changes no other
    row's inclusion: the rate is the same for n and n + 1."""
    from dpsynth_core.errors import DataError
    from dpsynth_core.privacy.randomness import working_set

    for n, m in ((1001, 1000), (1000, 300)):
        with pytest.raises(DataError, match="data.n_records: the file has more rows than this working-set size") as err:
            working_set(n, m, None, public_corpus=False, field="data.n_records")
        assert str(n) not in str(err.value) and str(m) not in str(err.value)
        kept_n = working_set(n, m, m / 1000, public_corpus=False, field="x", rng=_Draws())
        kept_more = working_set(n + 1, m, m / 1000, public_corpus=False, field="x", rng=_Draws())
        assert np.array_equal(kept_more[kept_more < n], kept_n)  # the other rows' inclusion is unchanged
    assert len(working_set(1000, 1000, None, public_corpus=False, field="x")) == 1000  # every row
    assert 200 < len(working_set(1000, 300, None, public_corpus=True, field="x")) < 400  # a bundled corpus
