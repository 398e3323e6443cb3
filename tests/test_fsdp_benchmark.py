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
