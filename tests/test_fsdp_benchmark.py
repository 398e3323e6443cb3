"""benchmarks/dpsgd_gpu.py runs on CPU at the tiny shape (issue 15.5): every mode, ratios to nondp,
generation with the DP adapter; the 7B shape refuses to run without a GPU."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import dpsgd_gpu  # noqa: E402


@pytest.mark.slow  # four fresh models and an opacus wrap each: ~1-2 min on the shared 2 cores
def test_tiny_run_reports_every_mode_as_a_ratio_to_nondp(tmp_path):
    out = tmp_path / "tiny.json"
    assert dpsgd_gpu.main(["--tiny", "--steps", "1", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    rows = {r["mode"]: r for r in result["modes"]}
    assert list(rows) == list(dpsgd_gpu.MODES)
    assert rows["nondp"]["tokens_per_s_vs_nondp"] == 1.0
    for r in rows.values():
        assert r["tokens_per_s"] > 0
        assert r["tokens_per_s_vs_nondp"] == pytest.approx(r["tokens_per_s"] / rows["nondp"]["tokens_per_s"])
    assert result["generation_tokens_per_s_with_dp_adapter"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_full_shape_needs_a_gpu():
    assert dpsgd_gpu.main(["--modes", "nondp"]) == 2


def test_dry_run_checks_every_part_in_seconds(tmp_path, capsys):
    """The one-command GPU run's wiring on CPU: every DP mode steps once, the ratios are printed, HF
    generation with the DP adapter runs, vLLM and ACTG say why they were not measured."""
    out = tmp_path / "dry.json"
    assert dpsgd_gpu.main(["--dry-run", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["dry_run"] and [r["mode"] for r in result["modes"]] == list(dpsgd_gpu.MODES)
    assert all(r["tokens_per_s"] > 0 for r in result["modes"])
    assert result["generation"]["hf_tokens_per_s"] > 0
    assert result["generation"]["vllm"] == {"measured": False, "reason": "dry run"}
    assert result["actg"]["measured"] is False and result["actg"]["reason"] == "dry run"
    printed = capsys.readouterr().out
    assert "vs nondp" in printed and "targets (issue 15)" in printed
    for mode in dpsgd_gpu.MODES:
        ratio = next(r["tokens_per_s_vs_nondp"] for r in result["modes"] if r["mode"] == mode)
        assert f"{ratio:.3f}" in printed


def test_actg_run_forces_every_causal_lm_stage_onto_the_device(tmp_path):
    import gpu_stages

    cfg = gpu_stages.actg_config_on(gpu_stages.ACTG_TINY, "cuda", tmp_path / "run")
    devices = gpu_stages.actg_stage_devices(cfg)
    assert {k: v for k, v in devices.items() if "no causal LM" not in v} == {
        "private (DP-SGD)": "cuda", "generate": "cuda", "anchored_rl": "cuda", "synthesize": "cuda"}
    assert cfg.resolved_run_dir() == tmp_path / "run"
    lm_judge = tmp_path / "lm_judge.yaml"
    lm_judge.write_text(gpu_stages.ACTG_TINY.read_text().replace("extractor: {kind: embedding}",
                                                                "extractor: {kind: lm, model: tiny-llama}"))
    cfg = gpu_stages.actg_config_on(lm_judge, "cuda", tmp_path / "run2")
    assert gpu_stages.actg_stage_devices(cfg)["best_of_n (reward)"] == "cuda"
