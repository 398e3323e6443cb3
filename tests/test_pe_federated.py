"""Federated WASP / Aug-PE: parties from separate files, or a non-IID Dirichlet(alpha) split of one file
(old code: round-robin, i.i.d. by construction). The released sum is the same either way."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpsynth_core.pe.config import PEConfig
from dpsynth_core.pe.federated import assign_parties, dirichlet_parties
from dpsynth_core.privacy.randomness import secure_rng

CLASSES = ["neuro", "micro", "bio"]


def _label_skew(labels, parties, num_parties) -> float:
    """Mean over classes of the largest share of that class held by one party (1/L: i.i.d., 1: one party)."""
    labels, parties = np.asarray(labels), np.asarray(parties)
    shares = [np.bincount(parties[labels == c], minlength=num_parties).max() / (labels == c).sum()
              for c in np.unique(labels)]
    return float(np.mean(shares))


def test_dirichlet_split_is_non_iid_and_alpha_controls_the_skew():
    labels = [CLASSES[i % 3] for i in range(3000)]
    rr = assign_parties(labels, 4, "round_robin", 1.0, secure_rng())
    assert _label_skew(labels, rr, 4) == pytest.approx(0.25, abs=0.01)  # the old split: i.i.d.
    skews = {a: np.mean([_label_skew(labels, dirichlet_parties(labels, 4, a, secure_rng()), 4) for _ in range(20)])
             for a in (0.05, 1.0, 1000.0)}
    assert skews[0.05] > 0.85 and skews[1000.0] < 0.3 and skews[0.05] > skews[1.0] > skews[1000.0]
    a, b = dirichlet_parties(labels, 4, 1.0, secure_rng()), dirichlet_parties(labels, 4, 1.0, secure_rng())
    assert (a != b).any()  # OS entropy, not a config seed
    cfg = PEConfig(method="augpe", data={"source": "biorxiv", "classes": CLASSES}, federated_parties=3)
    assert (cfg.federated_split, cfg.dirichlet_alpha) == ("dirichlet", 1.0)


def _party_file(path, party: int, n: int) -> str:
    rows = [{"abstract": f"party {party} record {i} about {CLASSES[i % 3]}", "category": CLASSES[i % 3]}
            for i in range(n)]
    pd.DataFrame(rows).to_csv(path, index=False)
    return str(path)


def test_parties_from_separate_files_keep_their_records_in_the_vote(tmp_path):
    from dpsynth_core.pe.data_split import split_data
    from dpsynth_core.pe.runner import PERunner
    from dpsynth_core.privacy import PrivacyLedger
    from tests.test_wasp_mechanics import HashEmbedding, RecordingLLM

    paths = [_party_file(tmp_path / f"p{j}.csv", j, 40 + 20 * j) for j in range(3)]
    cfg = PEConfig(method="augpe", data={"source": "file", "party_paths": paths, "classes": CLASSES,
                                         "num_private": 1000, "num_test": 6}, num_synthetic=6, iterations=1)
    assert cfg.federated_parties == 3
    with pytest.raises(ValueError, match="federated_parties"):
        PEConfig(method="augpe", data={"source": "file", "party_paths": paths, "classes": CLASSES},
                 federated_parties=2)
    private, _, _, _ = split_data(cfg)  # pool smaller than M: every non-held-out record
    assert [int(t.split()[1]) for t in private.texts] == private.parties  # each record keeps its file's party
    ledger = PrivacyLedger.create(tmp_path / "run", "t", epsilon_budget=4.0, delta=1e-5)
    from dpsynth_core.pe.prompts import load_prompts

    runner = PERunner(cfg, [RecordingLLM("p")], HashEmbedding(), load_prompts("biorxiv"), ledger, CLASSES)
    seen = {}
    real_aggregate = runner.mechanism.aggregate
    runner.mechanism.aggregate = lambda partials, rng: seen.setdefault("p", partials) and real_aggregate(partials, rng)
    runner.run(private)
    # Aug-PE: one vote per record, so party j's partial histogram sums to its number of records
    assert [float(p.sum()) for p in seen["p"]] == [float(private.parties.count(j)) for j in range(3)]
    (vote,) = [e for e in ledger.entries() if e.stage == "augpe.nn_vote"]
    assert vote.details["federated"]["split"] == "party files"
