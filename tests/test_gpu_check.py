"""The GPU check (scripts/gpu_check.sh, issue 40) at the tiny shape on the CPU: the product's engine
in every part, ratios to non-DP from one run, correctness checks that can fail, time limits."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import gpu_check  # noqa: E402
import gpu_check_correctness  # noqa: E402
import gpu_check_parts  # noqa: E402

CPU = torch.device("cpu")


def test_tiny_check_trains_through_the_engine_and_reports_ratios(tmp_path):
    parts = "env,train:nondp,train:hooks,generate"
    assert gpu_check.main(["--shape", "tiny", "--out", str(tmp_path), "--parts", parts, "--search", "16"]) == 0
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [p["part"] for p in report["parts"]] == parts.split(",")
    assert all(p["status"] == "ok" for p in report["parts"])
    env = report["parts"][0]["result"]
    assert env["missing"] == [] and env["engine_imports_heavy_modules"] == []
    modes = {r["mode"]: r for r in report["summary"]["modes"]}
    assert modes["nondp"]["tokens_vs_nondp"] == 1.0
    hooks = modes["hooks"]
    assert hooks["tokens_vs_nondp"] == pytest.approx(
        hooks["at_batch"]["tokens_per_s"] / modes["nondp"]["at_batch"]["tokens_per_s"])
    assert hooks["at_batch"]["batch"] == 8 and hooks["largest_batch"]["batch"] == 16
    generation = report["summary"]["generation"]
    assert set(generation) == {f"{k}_batch{b}" for k in ("unmerged", "merged") for b in (1, 32)}
    assert all(g["tokens_per_s"] > 0 for g in generation.values())
    assert next(p for p in report["parts"] if p["part"] == "generate")["result"]["adapter"].startswith("DP-trained")
    md = (tmp_path / "gpu_check.md").read_text()
    assert "| hooks |" in md and f"{hooks['tokens_vs_nondp']:.3f}" in md


def test_correctness_checks_pass_on_the_engine_and_fail_on_a_broken_one(monkeypatch):
    rows = gpu_check_correctness.clipped_sum_checks(CPU, ["hooks", "ghost"])
    rows += gpu_check_correctness.noise_checks(CPU, ["hooks"])
    assert all(r["passed"] for r in rows), rows
    # noise added twice must fail the noise check
    from dpsynth_core.dpsgd import engine as engine_module

    real = engine_module.privatize_and_reduce

    def twice(flat_sum, **kw):
        once = real(flat_sum, **kw)
        return once + (real(torch.zeros_like(flat_sum), **kw) if kw["noise_multiplier"] > 0 else 0)

    monkeypatch.setattr(engine_module, "privatize_and_reduce", twice)
    (noise,) = gpu_check_correctness.noise_checks(CPU, ["hooks"])
    assert not noise["passed"] and noise["value"] == pytest.approx(2**0.5, rel=0.05)


def test_a_part_past_its_limit_is_stopped(tmp_path):
    part = gpu_check.run_part("train:hooks", ["train", "--mode", "hooks", "--shape", "tiny"], 1.0,
                              tmp_path / "hooks.json")
    assert part["status"] == "stopped at its 1 s limit" and part["seconds"] < 10


def test_results_are_on_disk_after_every_update(tmp_path):
    out = gpu_check_parts.Results(str(tmp_path / "r.json"))
    out.put("at_batch", {"tokens_per_s": 1.0})
    assert json.loads((tmp_path / "r.json").read_text()) == {"at_batch": {"tokens_per_s": 1.0}}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_the_7b_shape_needs_a_gpu():
    with pytest.raises(SystemExit, match="needs a GPU"):
        gpu_check_parts.main(["train", "--shape", "7b"])
