"""Every benchmark prints each figure with its sample size, its repeats ("one run" / "N runs") and, for ratios and
scores with a trivial reference, its baseline (issue 38). Runs only the formatting functions on made-up rows, never
a benchmark itself."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import actg_table  # noqa: E402
import dpfair_generation_engines  # noqa: E402
import dpfair_table  # noqa: E402
import dpsgd_overhead  # noqa: E402
import generation_engines  # noqa: E402
import gpu_check  # noqa: E402
import pe_claim  # noqa: E402
import sample_size  # noqa: E402
import serve_engines  # noqa: E402
import serve_soak  # noqa: E402
import serve_throughput  # noqa: E402
import wasp_engines  # noqa: E402


def _line_with(text: str, figure: str) -> str:
    """The one printed line that holds ``figure`` (a figure must have its n on its own line or its table's)."""
    lines = [line for line in text.splitlines() if figure in line]
    assert lines, f"{figure!r} not printed:\n{text}"
    return lines[0]


def test_note_states_n_runs_and_baseline():
    assert sample_size.note("32 requests") == "(n = 32 requests; one run)"
    assert sample_size.note("32 requests", 2, "the HF app") == "(n = 32 requests; 2 runs; baseline: the HF app)"
    with pytest.raises(ValueError):
        sample_size.runs_text(0)


def test_serve_engines_ratios_name_requests_pair_and_baseline():
    rows = [{"backend": b, "requests": n, "repeat": r, "new_tokens": 64, "tokens_per_s": tps}
            for r in (0, 1) for n, (hf, vllm) in ((32, (80.0, 400.0)), (128, (50.0, 450.0)))
            for b, tps in (("hf", hf), ("vllm", vllm))]
    lines = serve_engines.ratio_lines(rows)
    assert len(lines) == 4
    line = _line_with("\n".join(lines), "= 5.0x")
    assert line.startswith("32 requests x 64 tokens, pair 1 of 2") and "the HF app (baseline)" in line
    assert "128 requests x 64 tokens, pair 2 of 2" in lines[-1] and "= 9.0x" in lines[-1]


def test_generation_engines_tables_state_prompts_tokens_and_baseline():
    rows = [{"model": "m", "backend": b, "prompts": 32, "new_tokens": 64, "load_s": 1.0, "wall_s": 2.0, "tokens": 2048,
             "tokens_per_s": tps, "p50_s": 1.0, "p99_s": 2.0} for b, tps in (("hf", 100.0), ("vllm", 330.0))]
    text = generation_engines.table(rows)
    assert "| 3.3x |" in _line_with(text, "330.0") and "| 32 |" in _line_with(text, "330.0")
    assert "n = the row's prompts x 64 sampled tokens; one run; baseline: HF" in text
    lora = [{**r, "backend": f"vllm {m}"} for r, m in zip(rows, ("lora", "merged"))]
    assert "baseline: vLLM's LoRA kernels" in generation_engines.lora_table(lora)


def test_actg_table_rows_carry_texts_seeds_and_the_constant_predictor():
    seed = {row: {"mauve": 0.5, "ifacc_judge": 0.4, "ifacc_reward": 0.3, "djs_f": 0.1, "djs_f_2way": 0.2,
                  "djs_f_same_reader": 0.1, "f1": 0.21, "f1_baseline": 0.07, "n_texts": 120}
            for row in ("ACTG", "vanilla DP-FT")}
    text = actg_table.table([seed, seed, seed])
    line = _line_with(text, "| ACTG |")
    assert line.startswith("| ACTG | 120 | 3 |") and "0.070 ± 0.000" in line
    assert "n = synthetic texts per seed" in text and "3 runs" in text and "baseline: the constant predictor" in text


def test_dpfair_tables_carry_rows_test_rows_and_trivial_baselines(tmp_path):
    run = {"method": "aim", "epsilon": 4.0, "n_synthetic": 200, "n_test": 3000, "majority_acc": 0.76,
           "constant_f1": 0.39, "acc_gb": 0.8}
    text = dpfair_table.markdown([{**run, "method": "AIM (smartnoise-synth)"}])
    line = _line_with(text, "AIM (smartnoise-synth)")
    assert "| 200 | 3000 | 0.760 | 0.390 |" in line
    assert "one run" in text and "baseline: majority-class accuracy and the constant predictor's F1" in text
    agg = [{"method": "AIM (3 runs)", "epsilon": 4.0, "runs": 3, "n_synthetic": "200", "n_test": "3000",
            "majority_acc": "0.760", "constant_f1": "0.390", "acc_gb": 0.8, "acc_gb_sd": 0.01}]
    text = dpfair_table.markdown_mean_sd(agg)
    assert "| 200 | 3000 | 0.760 | 0.390 |" in _line_with(text, "AIM (3 runs)") and "3 runs" in text


def test_dpsgd_overhead_table_states_timed_steps_and_baseline():
    row = {"model": "tiny-llama", "batch": 8, "mode": "ghost", "seq": 128, "nondp_s": 1.0, "dp_s": 1.5,
           "time_ratio": 1.5, "nondp_mem_mb": 100.0, "dp_mem_mb": 120.0, "mem_ratio": 1.2,
           "dp_times": [1.4, 1.5, 1.6], "nondp_times": [1.0, 1.0, 1.0]}
    text = dpsgd_overhead.render_table([row])
    assert "| ghost | 3 | 1.000 | 1.500 |" in _line_with(text, "| ghost |")
    assert "one run" in text and "baseline: the same engine without DP" in text


def test_pe_claim_table_states_seeds_sizes_and_the_majority_baseline():
    rows = [{"method": "wasp", "seed": s, "accuracy": a, "n_train": 150, "n_test": 400, "majority_baseline": 0.25}
            for s, a in ((0, 0.6), (1, 0.7))]
    text = pe_claim.table(rows, ["wasp"])
    line = _line_with(text, "0.650 +- ")
    assert line.split()[:4] == ["wasp", "2", "150", "400"] and "0.25" in line
    assert "2 runs" in text and "baseline: the majority class" in text


def test_serve_throughput_speedup_names_both_sample_sizes():
    rows = {"sequential generate (1 process)": {"requests": 8, "tokens": 512, "wall_s": 10.0, "tok_s": 51.2,
                                                "p50": 1.2, "p99": 1.4, "errors": 0},
            "Serve, 32 concurrent": {"requests": 32, "tokens": 2048, "wall_s": 10.0, "tok_s": 204.8, "p50": 9.0,
                                     "p99": 9.5, "errors": 0}}
    line = _line_with(serve_throughput.summary(rows, 32), "4.00x")
    assert "n = 32 requests through Serve; one run; baseline: sequential generate in one process, 8 requests" in line


def test_serve_soak_latency_states_how_many_requests(capsys):
    results = [("valid", 200, 1.0 + i / 10, "") for i in range(9)] + [("malformed", 422, 0.1, "")]
    serve_soak._report(results, [{"health": 200, "ready": 200, "health_s": 0.1, "ready_s": 0.1}], 12.0)
    out = capsys.readouterr().out
    assert "(n = 9 valid requests answered 200; one run)" in _line_with(out, "latency p50")
    assert "0 of 10 requests (one run)" in _line_with(out, "unexpected answers")


def test_gpu_check_markdown_states_tokens_timed_and_baseline():
    at = {"tokens_per_s": 1000.0, "peak_gib": 2.0, "tokens": 12288, "seconds": 12.3}
    report = {"date": "2026-11-26", "shape": "tiny", "parts": [
        {"part": "env", "status": "ok", "seconds": 1, "result": {"gpu": {"name": "H100"}, "versions": {}}},
        {"part": "train:nondp", "status": "ok", "seconds": 1, "result": {"at_batch": at}},
        {"part": "generate", "status": "ok", "seconds": 1, "result": {"generation": {
            "merged_batch32": {"tokens_per_s": 900.0, "new_tokens": 64, "batch": 32}}}}]}
    report["summary"] = gpu_check.summarize(report["parts"])
    text = gpu_check.markdown(report)
    assert "| nondp | 12288 | 1000 |" in text
    assert "baseline: the same engine without DP" in text and "baseline: the unmerged adapter" in text


def test_dpfair_generation_engines_summary_states_rows_and_baseline():
    rows = [{"engine": "vllm", "rows": 200, "attempted": 200, "invalid": 0, "wall_s": 20.0, "load_s": 15.0},
            {"engine": "hf", "rows": 200, "attempted": 210, "invalid": 10, "wall_s": 100.0, "load_s": 3.0}]
    text = dpfair_generation_engines.summary(rows)
    assert "(n = 200 rows; one run)" in _line_with(text, "hf: 200 rows (210 attempted, 10 invalid) in 100.0 s")
    line = _line_with(text, "5.0x faster")
    assert "with load: 2.9x" in line and "baseline: HF, the generate stage's engine" in line
    assert line.endswith("order vllm then hf")


def test_wasp_engines_summary_states_samples_plms_and_baseline():
    rows = [{"engine": e, "plms": ["a", "b"], "wall_s": w, "iteration_s": it, "zero_shot_s": 10.0,
             "zero_shot_samples": 75, "iteration_samples": 75} for e, w, it in (("hf", 300.0, 120.0),
                                                                                 ("vllm", 150.0, 30.0))]
    text = wasp_engines.summary(rows)
    assert "(n = 75 samples in the iteration, 75 zero-shot, 2 PLMs; one run)" in _line_with(text, "hf: iteration 1")
    line = _line_with(text, "HF / vLLM: iteration 4.0x, whole command 2.0x")
    assert "baseline: HF" in line and line.endswith("order hf then vllm")
