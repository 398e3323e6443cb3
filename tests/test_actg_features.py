"""DP attribute features with AIM (real smartnoise-synth) and marginal d_JS."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from dpsynth_core.actg.features import aim_rho, marginal_djs, synthesize_features
from dpsynth_core.actg.schema import schema_from_dict
from dpsynth_core.errors import BudgetExceededError, ConfigError, DataError
from dpsynth_core.privacy import PrivacyLedger, ZCdpEvent, zcdp_to_epsilon

SCHEMA = schema_from_dict({"name": "toy", "fields": [
    {"name": "area", "options": ["Neuro", "Ecology", "Cell", "Other"]},
    {"name": "organism", "options": ["Human", "Mouse", "Plant"]},
    {"name": "scale", "options": ["Molecular", "Cellular", "Organismal", "Population", "Never seen"]},
]})


def _real(n=300, seed=0):
    rng = np.random.default_rng(seed)
    area = rng.choice(["Neuro", "Ecology", "Cell"], size=n, p=[0.5, 0.2, 0.3])
    organism = np.where(area == "Ecology", "Plant", rng.choice(["Human", "Mouse"], size=n))
    scale = rng.choice(["Molecular", "Cellular", "Organismal"], size=n)
    return pd.DataFrame({"area": area, "organism": organism, "scale": scale})


def test_aim_rho_matches_smartnoise_and_stays_within_eps():
    from snsynth.utils import cdp_rho

    for eps, delta in [(0.5, 1e-5), (2.0, 1e-6), (4.0, 1e-3)]:
        rho = aim_rho(eps, delta)
        assert rho == pytest.approx(cdp_rho(eps, delta), rel=1e-6)
        assert zcdp_to_epsilon(rho, delta) <= eps
        assert ZCdpEvent(rho=rho).epsilon(delta) == pytest.approx(eps, rel=1e-6)


def test_aim_respects_eps1_in_ledger(tmp_path, monkeypatch):
    import snsynth.aim.aim
    import snsynth.utils

    class Tripwire:  # smartnoise's selection RNG (numpy's global one): must not be used in a real fit
        def choice(self, *a, **k):
            raise AssertionError("AIM drew a DP selection from numpy's global RNG")

    monkeypatch.setattr(snsynth.utils, "prng", Tripwire())
    monkeypatch.setattr(snsynth.aim.aim, "prng", Tripwire())
    real = _real()
    ledger = PrivacyLedger.create(tmp_path, "toy", epsilon_budget=1.5, delta=1e-5)
    synth = synthesize_features(real, SCHEMA, epsilon=1.0, n_rows=250, ledger=ledger, seed=3,
                                out_path=tmp_path / "features.csv", max_model_size=10)
    # ledger: one zCDP event whose epsilon alone is <= eps1, total <= eps1
    entries = ledger.entries()
    assert len(entries) == 1 and entries[0].stage == "aim_features"
    assert entries[0].epsilon <= 1.0 and ledger.total_epsilon() <= 1.0 + 1e-9
    assert ledger.total_epsilon() == pytest.approx(1.0, rel=1e-6)
    # output: n rows, schema options only, shuffled (AIM emits sorted rows), written atomically
    assert len(synth) == 250 and list(synth.columns) == SCHEMA.field_names
    SCHEMA.validate_table(synth)
    keys = list(zip(synth["area"], synth["organism"], synth["scale"]))
    assert keys != sorted(keys)
    on_disk = pd.read_csv(tmp_path / "features.csv")
    pd.testing.assert_frame_equal(on_disk, synth)
    assert not list(tmp_path.glob(".features.csv.*"))
    # AIM learnt the strong real association a bit: d_JS of 1-way marginals well below the uniform one
    uniform = pd.DataFrame({c: np.resize(SCHEMA.options(c), 300) for c in SCHEMA.field_names})
    assert marginal_djs(real, synth, 1, SCHEMA.categories())["mean"] < \
        marginal_djs(real, uniform, 1, SCHEMA.categories())["mean"]

    # a second request over the remaining budget is refused BEFORE AIM reads anything
    sentinel = real.copy()
    sentinel.loc[0, "area"] = "NOT AN OPTION"  # would raise DataError if the data were read
    with pytest.raises(BudgetExceededError):
        synthesize_features(sentinel, SCHEMA, epsilon=2.0, n_rows=10, ledger=ledger)
    assert len(ledger.entries()) == 1


def test_invalid_values_rejected_without_leaking(tmp_path):
    ledger = PrivacyLedger.create(tmp_path, "toy", epsilon_budget=2.0, delta=1e-5)
    bad = _real(20)
    bad.loc[7, "organism"] = "SECRET-ORGANISM"
    with pytest.raises(DataError) as info:
        synthesize_features(bad, SCHEMA, epsilon=0.5, n_rows=10, ledger=ledger)
    assert "column 'organism', row 7" in str(info.value) and "SECRET" not in str(info.value)
    assert ledger.entries() == []  # nothing spent
    with pytest.raises(ConfigError):
        synthesize_features(_real(20), SCHEMA, epsilon=0.5, n_rows=0, ledger=ledger)


def test_marginal_djs_identical_and_different():
    real = _real(200)
    for order in (1, 2):
        same = marginal_djs(real, real.sample(frac=1.0, random_state=1), order, SCHEMA.categories())
        assert same["mean"] == pytest.approx(0.0, abs=1e-9) and same["max"] == pytest.approx(0.0, abs=1e-9)
    other = real.assign(area="Other")
    one = marginal_djs(real, other, 1, SCHEMA.categories())
    # disjoint supports: the largest JS distance in scipy's default base e, sqrt(ln 2)
    assert one["per_marginal"]["area"] == pytest.approx(math.sqrt(math.log(2)))
    assert one["per_marginal"]["scale"] == pytest.approx(0.0, abs=1e-9)
    two = marginal_djs(real, other, 2, SCHEMA.categories())
    assert set(two["per_marginal"]) == {"area|organism", "area|scale", "organism|scale"}
    assert two["per_marginal"]["organism|scale"] == pytest.approx(0.0, abs=1e-9)
    assert two["mean"] > 0.5
    with pytest.raises(ConfigError):
        marginal_djs(real, other, 3)
    with pytest.raises(DataError, match="lacks column"):
        marginal_djs(real, other[["area"]], 1)


def test_biorxiv_marginals_real_split(biorxiv_csv):
    """Two halves of the real attribute table are close; a shuffled-column table is not closer."""
    labels = pd.DataFrame(pd.read_csv(biorxiv_csv, usecols=["schema"])["schema"].map(json.loads).tolist())
    a, b = labels.iloc[:750], labels.iloc[750:]
    d1 = marginal_djs(a, b, 1)["mean"]
    d2 = marginal_djs(a, b, 2)["mean"]
    assert 0 < d1 < 0.15 and d1 < d2 < 0.5


def test_too_few_aim_rounds_are_refused_before_the_budget_is_touched(tmp_path):
    """rounds <= 0.9 x columns: smartnoise's 1-way phase alone would spend the whole rho or more (it crashed with
    "Probabilities contain NaN"); a config error naming the key, before any row is read or anything is charged."""
    ledger = PrivacyLedger.create(tmp_path, "toy", epsilon_budget=1.5, delta=1e-5)
    with pytest.raises(ConfigError, match=r"features.options.rounds: 2 rounds are too few for 3 columns"):
        synthesize_features(_real(), SCHEMA, epsilon=1.0, n_rows=10, ledger=ledger, rounds=2)
    assert ledger.entries() == []
