"""WASP / Aug-PE end to end on real bioRxiv records with tiny-llama PLMs: two PLMs through Ray Serve
and a Ray actor, the privacy ledger, checkpoints and resume (no double counting, no second noisy
vote after a crash)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from dpsynth_core.privacy.gaussian_histogram import calibrate_histogram_noise
from dpsynth_core.privacy import PrivacyLedger

CLASSES = ["neuroscience", "bioinformatics", "microbiology"]


def _write_config(tmp_path: Path, name: str, **overrides) -> Path:
    cfg = {
        "method": "wasp",
        "run_dir": str(tmp_path / name),
        "data": {"source": "biorxiv", "classes": CLASSES, "num_private": 12, "num_test": 0},
        "plms": [
            {"model": "tiny-llama", "name": "tiny-a", "backend": "hf", "temperature": 1.0, "seed": 1, "batch_size": 8},
            {"model": "tiny-llama", "name": "tiny-b", "backend": "hf", "temperature": 1.3, "seed": 2, "batch_size": 8},
        ],
        "epsilon": 4.0, "iterations": 2, "num_synthetic": 18, "q": 1, "select_per_class": 2,
        "max_new_tokens": 8, "seed": 0, "evaluate": False,
    }
    cfg.update(overrides)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _vote_entries(run_dir: Path, stage: str):
    return [e for e in PrivacyLedger.open(run_dir).entries() if e.stage == stage]


def test_wasp_two_iterations_serve_and_actor_backends(ray_session, biorxiv_csv, tmp_path):
    """Two tiny-llama PLMs, one behind a Ray Serve Generator deployment and one in a Ray actor,
    called concurrently; 2 DP iterations; outputs, weights and the ledger checked."""
    from ray import serve

    from ray_jobs import wasp
    from ray_jobs.pe_backends import SERVE_APP

    path = _write_config(tmp_path, "wasp_serve", plms=[
        {"model": "tiny-llama", "name": "tiny-serve", "backend": "serve", "temperature": 1.0, "seed": 1, "batch_size": 8},
        {"model": "tiny-llama", "name": "tiny-actor", "backend": "ray_actor", "temperature": 1.3, "seed": 2, "batch_size": 8},
    ])
    run_dir = wasp.main(path)
    assert ray_session.is_initialized()  # the driver leaves a Ray it did not start alone
    assert SERVE_APP not in serve.status().applications  # the PLM app is torn down after the run

    metrics = json.loads((run_dir / "metrics.json").read_text())
    hist = metrics["history"]
    assert [r["iteration"] for r in hist] == [0, 1, 2]
    for r in hist:
        assert sum(r["plm_weights"]) == pytest.approx(1.0)
        assert min(r["plm_weights"]) >= 0
    assert [r["generated"] for r in hist] == [6, 6, 6]  # N = 18 over T + 1 = 3 rounds
    assert hist[2]["population"] == 18 and hist[1]["scored"] == 6 and hist[2]["scored"] == 12

    rows = _rows(run_dir / "synthetic.jsonl")
    assert len(rows) == 18
    assert {r["label"] for r in rows} == set(CLASSES)
    assert {r["plm"] for r in rows} == {"tiny-serve", "tiny-actor"}  # both backends produced samples
    assert sorted({r["iteration"] for r in rows}) == [0, 1, 2]

    delta = 1e-5  # the paper's delta (default)
    nm = calibrate_histogram_noise(4.0, delta, 2)
    sens = math.sqrt(2)  # Q = 1
    votes = _vote_entries(run_dir, "wasp.topq_vote")
    assert len(votes) == 1
    assert votes[0].params == {"noise_multiplier": pytest.approx(nm), "compositions": 2}
    assert votes[0].details["sensitivity_l2"] == pytest.approx(sens)
    assert votes[0].details["sigma"] == pytest.approx(nm * sens)
    assert hist[1]["sigma"] == pytest.approx(nm * sens)
    ledger = PrivacyLedger.open(run_dir)
    assert ledger.delta == pytest.approx(delta)
    assert 3.99 < ledger.total_epsilon() <= 4.0 * (1 + 1e-9)
    assert {e.stage for e in ledger.entries()} == {"wasp.topq_vote", "wasp.generate"}
    # each iteration's noisy vote (the DP release) is kept: nearest + farthest, one bin per sample
    for t, n in ((1, 6), (2, 12)):
        stored = json.loads((run_dir / "votes" / f"iter_{t:04d}.json").read_text())
        assert stored["size"] == n and len(stored["noisy"]) == 2 * n


def test_augpe_federated_run(biorxiv_csv, tmp_path):
    """Aug-PE (one in-process PLM), federated over L = 2 parties: sensitivity 1, sigma of the sum."""
    from dpsynth_core.pe.pipeline import run_pipeline
    from ray_jobs.pe_backends import make_llms

    path = _write_config(tmp_path, "augpe_fed", method="augpe", num_synthetic=9, federated_parties=2,
                         plms=[{"model": "tiny-llama", "name": "tiny-a", "backend": "hf", "seed": 1, "batch_size": 8}])
    cfg = yaml.safe_load(path.read_text())
    for key in ("q", "select_per_class"):
        cfg.pop(key)
    path.write_text(yaml.safe_dump(cfg))
    run_dir = run_pipeline(path, "augpe", make_llms)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [r["iteration"] for r in metrics["history"]] == [0, 1, 2]
    assert metrics["num_synthetic"] == 9
    nm = calibrate_histogram_noise(4.0, 1e-5, 2)
    (vote,) = _vote_entries(run_dir, "augpe.nn_vote")
    assert vote.details["sensitivity_l2"] == 1.0 and vote.details["federated_parties"] == 2
    assert vote.details["sigma"] == pytest.approx(nm)
    rows = _rows(run_dir / "synthetic.jsonl")
    assert len(rows) == 9 and [r["label"] for r in rows].count("microbiology") == 3
    from dpsynth_core.privacy.release_check import verify_release

    assert set(verify_release(run_dir)["files"]) == {"synthetic.jsonl", "ledger.json", "ledger.txt"}  # no metrics


def test_resume_after_interruption_does_not_double_count(biorxiv_csv, tmp_path):
    from dpsynth_core.pe.callbacks import InterruptedRun, StopAfter
    from dpsynth_core.pe.checkpoint import load_latest_checkpoint
    from dpsynth_core.pe.pipeline import run_pipeline
    from ray_jobs.pe_backends import make_llms

    path = _write_config(tmp_path, "wasp_resume")
    run_dir = tmp_path / "wasp_resume"
    with pytest.raises(InterruptedRun):
        run_pipeline(path, "wasp", make_llms, callbacks=[StopAfter(1)])
    assert load_latest_checkpoint(run_dir).iteration == 1
    assert not (run_dir / "metrics.json").exists()
    (first,) = _vote_entries(run_dir, "wasp.topq_vote")
    eps_before = PrivacyLedger.open(run_dir).total_epsilon()

    assert run_pipeline(path, "wasp", make_llms) == run_dir  # same directory, resumed
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert [r["iteration"] for r in metrics["history"]] == [0, 1, 2]
    assert [r["iteration"] for r in _rows(run_dir / "metrics.jsonl")] == [0, 1, 2]
    assert len(_rows(run_dir / "synthetic.jsonl")) == 18
    (again,) = _vote_entries(run_dir, "wasp.topq_vote")  # recorded once, for all T iterations
    assert again.id == first.id and again.params["compositions"] == 2
    assert len(PrivacyLedger.open(run_dir).entries()) == 2
    assert PrivacyLedger.open(run_dir).total_epsilon() == pytest.approx(eps_before)
    # a finished run re-invoked does nothing more
    run_pipeline(path, "wasp", make_llms)
    assert len(PrivacyLedger.open(run_dir).entries()) == 2
    assert [r["iteration"] for r in json.loads((run_dir / "metrics.json").read_text())["history"]] == [0, 1, 2]


def test_crash_after_vote_reuses_the_noisy_release(biorxiv_csv, tmp_path):
    """A PLM fails right after iteration 1's vote (before its checkpoint). With OS-entropy noise,
    redrawing would release a second noisy histogram; the resumed run re-uses the stored one."""
    from dpsynth_core.pe.llm import LLM
    from dpsynth_core.pe.pipeline import run_pipeline
    from ray_jobs.pe_backends import make_llms

    class DropsSecondCall(LLM):
        """A real tiny-llama whose second request fails, like a dropped API connection."""

        def __init__(self, inner):
            self.inner, self.name, self.calls = inner, inner.name, 0

        def generate(self, prompts, params):
            self.calls += 1
            if self.calls == 2:
                raise ConnectionError("PLM endpoint went away")
            return self.inner.generate(prompts, params)

    path = _write_config(tmp_path, "wasp_crash")
    run_dir = tmp_path / "wasp_crash"
    with pytest.raises(ConnectionError):
        run_pipeline(path, "wasp", lambda plms: [DropsSecondCall(m) for m in make_llms(plms)])
    vote_file = run_dir / "votes" / "iter_0001.json"
    released = vote_file.read_bytes()
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "iter_0000.json"

    run_pipeline(path, "wasp", make_llms)
    assert vote_file.read_bytes() == released  # not redrawn
    noisy = np.asarray(json.loads(released)["noisy"])
    pop0 = json.loads((run_dir / "checkpoints" / "iter_0000.json").read_text())["population"]
    expected = np.bincount(pop0["plm_ids"], weights=np.maximum(noisy[: len(pop0["texts"])], 0), minlength=2)
    hist = json.loads((run_dir / "metrics.json").read_text())["history"]
    assert hist[1]["votes_per_plm"] == pytest.approx(expected.tolist())
    assert len(_vote_entries(run_dir, "wasp.topq_vote")) == 1
