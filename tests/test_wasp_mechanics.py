"""WASP as published: 50 % of the S good / S bad examples per contrastive prompt, ablation switches
(contrastive off, PLM weighting off, Q = 1), the epsilon = inf reference run, and refusal of degenerate
Top-Q votes -- through the real runner with in-process fake PLMs and a deterministic embedding."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from dpsynth_core.config import load_config
from dpsynth_core.engines import SamplingParams
from dpsynth_core.errors import ConfigError
from dpsynth_core.pe.config import PEConfig
from dpsynth_core.pe.embedding import Embedding
from dpsynth_core.pe.llm import LLM
from dpsynth_core.pe.prompts import load_prompts
from dpsynth_core.pe.runner import PERunner, PrivateData
from dpsynth_core.privacy import PrivacyLedger

CLASSES = ["a", "b"]
REPO = Path(__file__).resolve().parents[1]


class HashEmbedding(Embedding):
    """Each text to a fixed pseudo-random unit vector (deterministic, no model)."""

    name = "hash"

    def encode(self, texts):
        rows = [np.random.default_rng(int(hashlib.sha256(t.encode()).hexdigest()[:8], 16)).normal(size=8)
                for t in texts]
        out = np.asarray(rows, dtype=np.float32).reshape(len(texts), 8)
        return out / np.linalg.norm(out, axis=1, keepdims=True).clip(1e-9)


class RecordingLLM(LLM):
    """Writes unique numbered samples and keeps every prompt it was sent."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.prompts: list[str] = []

    def generate(self, prompts: list[str], params: SamplingParams) -> list[str]:
        self.prompts += prompts
        return [f"{self.name} sample {len(self.prompts) - len(prompts) + i} seed {params.seed}"
                for i in range(len(prompts))]


def _run(tmp_path: Path, **over):
    base = dict(method="wasp", data={"source": "biorxiv", "classes": CLASSES, "num_private": 20},
                plms=[{"name": "p0"}, {"name": "p1"}], iterations=2, num_synthetic=48, q=2,
                select_per_class=4, evaluate=False)
    cfg = PEConfig(**{**base, **over})
    ledger = PrivacyLedger.create(tmp_path, "t", epsilon_budget=cfg.epsilon if not cfg.is_reference else 1e6,
                                  delta=1e-5)
    llms = [RecordingLLM("p0"), RecordingLLM("p1")]
    runner = PERunner(cfg, llms, HashEmbedding(), load_prompts("biorxiv"), ledger, CLASSES)
    private = PrivateData([f"private record {i}" for i in range(20)], [CLASSES[i % 2] for i in range(20)])
    return runner, runner.run(private), ledger, llms


def _examples(prompt: str, section: str) -> list[str]:
    """The numbered examples listed under 'Good examples' or 'Bad examples'."""
    m = re.search(section + r" examples[^\n]*\n(.*?)\n\n", prompt, re.S)
    return [] if m is None else re.findall(r"^\d+\. (.*)$", m.group(1), re.M)


def test_each_contrastive_prompt_draws_half_of_the_good_and_bad_examples(tmp_path):
    """S = 4: every prompt shows 2 good and 2 bad samples, drawn afresh per prompt (old code: all 4)."""
    _, _, _, llms = _run(tmp_path)
    contrastive = [p for llm in llms for p in llm.prompts if "Bad examples" in p]
    assert len(contrastive) == 32  # 2 rounds x 16
    good_sets = set()
    for p in contrastive:
        good, bad = _examples(p, "Good"), _examples(p, "Bad")
        assert len(good) == 2 and len(bad) == 2
        good_sets.add(frozenset(good))
    assert len(good_sets) > 4  # different prompts of a round show different halves


def test_ablations_contrastive_off_and_weighting_off(tmp_path):
    """contrastive: false keeps the same DP vote (same sensitivity and sigma) but prompts show good
    examples only; plm_weighting: uniform keeps equal PLM budgets whatever the votes."""
    base, state, ledger, _ = _run(tmp_path / "base")
    runner, state, ledger, llms = _run(tmp_path / "no_contrastive", contrastive=False)
    later = [p for llm in llms for p in llm.prompts if "Good examples" in p]
    assert later and not any("Bad examples" in p for p in later)
    assert all(len(_examples(p, "Good")) == 2 for p in later)
    assert runner.mechanism.sigma == pytest.approx(base.mechanism.sigma)
    _, state, _, _ = _run(tmp_path / "uniform", plm_weighting="uniform")
    assert all(r["plm_weights"] == [0.5, 0.5] for r in state.history)
    assert all(r["budgets"] == [8, 8] for r in state.history)


def test_q1_is_configurable_and_its_sensitivity_is_sqrt2(tmp_path):
    runner, state, ledger, _ = _run(tmp_path, q=1)
    (vote,) = [e for e in ledger.entries() if e.stage == "wasp.topq_vote"]
    assert vote.details["q"] == 1 and vote.details["sensitivity_l2"] == pytest.approx(2**0.5)


def test_degenerate_topq_vote_is_refused_before_any_private_read(tmp_path):
    """The old demo: N = 60 over T + 1 = 3 rounds and 5 classes gives 4 candidates per class, Q = 8:
    every record votes for every candidate. Refused before the ledger records a vote (old code: a
    warning, then the whole epsilon spent)."""
    five = [f"c{i}" for i in range(5)]
    cfg = PEConfig(method="wasp", data={"source": "biorxiv", "classes": five}, plms=[{}], num_synthetic=60,
                   q=8, iterations=2)
    ledger = PrivacyLedger.create(tmp_path / "r", "t", epsilon_budget=4.0, delta=1e-5)
    runner = PERunner(cfg, [RecordingLLM("p")], HashEmbedding(), load_prompts("biorxiv"), ledger, five)
    assert runner.first_vote_candidates_per_class() == 4
    with pytest.raises(ConfigError, match="degenerate"):
        runner.run(PrivateData(["x"] * 10, [five[i % 5] for i in range(10)]))
    assert not any(e.stage == "wasp.topq_vote" for e in ledger.entries())
    # 8 per class with Q = 4 is allowed (nearest and farthest sets can be disjoint)
    _run(tmp_path / "ok", num_synthetic=48, q=4)
    with pytest.raises(ConfigError, match="degenerate"):
        _run(tmp_path / "bad", num_synthetic=48, q=5)
    _run(tmp_path / "forced", num_synthetic=48, q=5, allow_degenerate_votes=True)


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("wasp_*.yaml")))
def test_shipped_wasp_configs_vote_non_degenerately(name):
    cfg = load_config(REPO / "configs" / name, PEConfig)
    per_round = cfg.num_synthetic // (cfg.iterations + 1)
    assert per_round // len(cfg.data.classes) >= 2 * cfg.q, name


def test_epsilon_inf_reference_run_needs_not_private_and_marks_the_ledger(tmp_path):
    with pytest.raises(ValueError, match="not_private"):
        PEConfig(method="wasp", data={"source": "biorxiv", "classes": CLASSES}, epsilon=float("inf"))
    with pytest.raises(ValueError, match="not_private"):
        PEConfig(method="wasp", data={"source": "biorxiv", "classes": CLASSES}, not_private=True)
    runner, state, ledger, _ = _run(tmp_path, epsilon=float("inf"), not_private=True)
    assert not ledger.is_private
    assert any("epsilon = inf" in m["reason"] for m in ledger.not_private_reasons())
    assert not any(e.stage == "wasp.topq_vote" for e in ledger.entries())  # no finite epsilon to record
    # no noise: each vote's nearest histogram sums exactly to 20 records x (1 + 1/2) (Q = 2)
    for row in state.history[1:]:
        assert sum(row["votes_per_plm"]) == pytest.approx(20 * 1.5) and row["sigma"] == 0.0
