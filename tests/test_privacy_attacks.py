"""Attacks on released outputs that worked on the old code (issue 12) and must fail now.

(a) DPFairLLM's fair_targets: rebuild dp_fair_stats' "noise" from the public config seed and
    subtract it: the exact private sex x income table came back.
(b) PE / WASP: a pinned noise_seed (public in config.yaml) lets anyone redraw the vote noise and
    recover the raw vote histogram; the knob is now refused in real runs and marks the ledger.
(c) Private working set (ACTG, PE): picked by a seeded permutation, so the subset was public and
    neighbouring files gave unrelated subsets. Now: a secret Bernoulli sample of a pool that
    changes by at most one row between neighbouring files.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest

from dpsynth_core.privacy import PrivacyLedger
from dpsynth_core.tabular.dp_domain import dp_group_label_table
from dpsynth_core.tabular.schema import TableSchema

PUBLIC_SEED = 0  # cfg.data.seed as written to the run's config.yaml


def test_fair_stats_noise_cannot_be_rebuilt_from_the_config_seed(tmp_path):
    rng = np.random.default_rng(11)
    frame = pd.DataFrame({"sex": rng.choice(["Female", "Male"], 600, p=[0.35, 0.65]),
                          "income": rng.choice(["<=50K", ">50K"], 600, p=[0.75, 0.25])})
    schema = TableSchema(columns=[
        {"name": "sex", "type": "categorical", "categories": ["Female", "Male"]},
        {"name": "income", "type": "categorical", "categories": ["<=50K", ">50K"]},
    ], sensitive=["sex"], target="income")
    ledger = PrivacyLedger.create(tmp_path, "adult", epsilon_budget=4.0, delta=1e-5)
    released = dp_group_label_table(frame, schema, "sex", epsilon=1.0, ledger=ledger)  # fair_targets.json
    sigma = ledger.entries()[0].details["sigma"]  # released with the ledger

    # the attack: the old noise was np.random.default_rng(seed).normal(0, sigma, shape)
    table = np.array([[released[a][y] for y in ("<=50K", ">50K")] for a in ("Female", "Male")])
    recovered = table - np.random.default_rng(PUBLIC_SEED).normal(0.0, sigma, size=table.shape)
    exact = pd.crosstab(frame.sex, frame.income).to_numpy(float)
    assert not np.allclose(recovered, exact, atol=0.5)  # old code: equal to 1e-9 in every cell


def _pe_runner(tmp_path, **over):
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.pe.runner import PERunner

    cfg = PEConfig(method="augpe", data={"source": "biorxiv", "classes": ["x", "y"]}, iterations=2, **over)
    ledger = PrivacyLedger.create(tmp_path, "pe", epsilon_budget=cfg.epsilon, delta=1e-5)
    return PERunner(cfg, [None], None, None, ledger, ["x", "y"]), ledger


def _redraw_attack(runner, raw: np.ndarray, seed: int) -> np.ndarray:
    """The adversary: noisy votes (votes/iter_0001.json) minus noise redrawn from the config seed."""
    noisy = runner.mechanism.privatize(raw, runner._noise_rng(1))
    return noisy - np.random.default_rng([seed, 1]).normal(0.0, runner.mechanism.sigma, size=raw.shape)


def test_pe_vote_noise_cannot_be_redrawn_in_a_real_run(tmp_path, monkeypatch):
    from pydantic import ValidationError

    raw = np.array([3.0, 0.0, 5.0, 1.0, 2.0, 0.0])  # one vote per private record: their neighbourhoods
    monkeypatch.delenv("DPSYNTH_TEST_MODE", raising=False)
    with pytest.raises(ValidationError, match="noise_seed"):  # old code: accepted (configs/wasp_tiny.yaml had 7)
        _pe_runner(tmp_path / "pinned", noise_seed=7)
    runner, ledger = _pe_runner(tmp_path / "real")
    assert not np.allclose(_redraw_attack(runner, raw, 7), raw, atol=0.5)
    # the knob still exists for tests -- where the attack does work, and the ledger says so
    monkeypatch.setenv("DPSYNTH_TEST_MODE", "1")
    runner, ledger = _pe_runner(tmp_path / "test_mode", noise_seed=7)
    assert np.allclose(_redraw_attack(runner, raw, 7), raw)
    runner._record_privacy()
    assert ledger.to_dict()["private"] is False


# ------------------------------------------------------------------------------------- subsets
def _corpus(n: int, seed: int = 3) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    labels = rng.choice(["neuro", "micro", "bio"], n)
    return pd.DataFrame({"abstract": [f"record {i} about {y} {rng.integers(1e9)}" for i, y in enumerate(labels)],
                         "category": labels})


def _write(frame: pd.DataFrame, path) -> str:
    frame.to_csv(path, index=False)
    return str(path)


def _actg_split(path: str):
    from dpsynth_core.actg.data_split import load_private_split
    from dpsynth_core.actg.pipeline import ActgConfig

    cfg = ActgConfig(data={"path": path, "n_records": 40, "n_eval": 20, "sample_fraction": 40 / 180})
    private, held, _ = load_private_split(cfg)
    return list(private["abstract"]), list(held["abstract"])


def _pe_split(path: str):
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.pe.data_split import split_data

    cfg = PEConfig(method="wasp", data={"source": "file", "path": path, "classes": ["neuro", "micro", "bio"],
                                        "num_private": 40, "sample_fraction": 40 / 179, "num_test": 21})
    private, test_texts, _, _ = split_data(cfg)
    return list(private.texts), test_texts


@pytest.mark.parametrize("split", [_actg_split, _pe_split], ids=["actg", "pe"])
def test_private_subset_is_a_secret_bernoulli_sample_and_neighbours_stay_neighbours(tmp_path, split):
    frame = _corpus(200)
    path = _write(frame, tmp_path / "d.csv")
    draws = [split(path) for _ in range(6)]
    held = draws[0][1]
    for private, held_again in draws:
        assert held_again == held  # owner-side held-out set: public rule, reproducible
        assert not set(private) & set(held)  # disjoint from every private draw
    # secret: two runs of the same config on the same file read different private records
    assert len({tuple(p) for p, _ in draws}) == len(draws)
    # Bernoulli: the size varies around the expected 40 (a fixed-size draw would give 40 each time)
    sizes = [len(p) for p, _ in draws]
    assert len(set(sizes)) > 1 and 20 < np.mean(sizes) < 60

    # neighbouring file: one record added. The held-out set moves by at most one row, so the
    # private pools differ by exactly one record (old code: unrelated seeded permutations)
    extra = pd.DataFrame({"abstract": ["the added record about micro"], "category": ["micro"]})
    neighbour = _write(pd.concat([frame, extra], ignore_index=True), tmp_path / "d_plus_one.csv")
    held_plus = split(neighbour)[1]
    moved = Counter(held) - Counter(held_plus), Counter(held_plus) - Counter(held)
    assert sum(moved[0].values()) <= 1 and sum(moved[1].values()) <= 1
    pool = Counter(frame["abstract"]) - Counter(held)
    pool_plus = Counter(pd.concat([frame, extra])["abstract"]) - Counter(held_plus)
    assert sum(((pool - pool_plus) + (pool_plus - pool)).values()) == 1
