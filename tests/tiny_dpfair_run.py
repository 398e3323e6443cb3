"""One tiny DPFairLLM run through the Ray driver, shared by the files that need a finished one:
tests/test_tabular_ledger.py asserts on its ledger, Ray task arguments and files, and tests/test_report.py
renders its report (on a copy). A tiny run costs about 50 s of the suite's two cores; one is enough for both
(tests/conftest.py keeps the files in one xdist group, so one worker builds it).
"""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ADULT_SCHEMA = REPO / "configs" / "schemas" / "adult.yaml"


def tiny_dpfair_config(tmp_path: Path, **over) -> Path:
    cfg = {
        "name": "t", "output_dir": str(tmp_path / "runs"), "schema_path": str(ADULT_SCHEMA),
        "columns": ["age", "education", "capital_loss", "race", "sex", "hours_per_week", "income"],
        "data": {"source": "adult", "train_rows": 160, "test_rows": 300, "seed": 0},
        "recipe": "none", "epsilon": 3.0, "budget": {"domain": 0.05, "fair_stats": 0.05, "marginals": 0.1},
        # stage 1 on rows drawn from DP 1-way marginals (the dp_marginals stage)
        "training": {"model": "tiny-llama", "steps": 2, "expected_batch_size": 16, "physical_batch_size": 16,
                     "learning_rate": 0.005, "max_seq_len": 64, "clipping": "hooks",
                     "public_stage": {"steps": 2, "rows": 32, "batch_size": 8, "rows_from": "dp_marginals"}},
        # two attributes; the equalized-odds term renews its constants from 4 generated rows at step 0
        "fairness": {"lambda_dp": {"sex": 1.0, "race": 0.5}, "lambda_eo": 0.5, "sensitive": ["sex", "race"], "eo_rows": 4},
        # a pool of 32 rows raked to the DP marginals (and to demographic parity), 16 of them released
        "generation": {"num_rows": 16, "batch_size": 16, "calibrate": {"enabled": True, "pool_factor": 2.0},
                       "fairness": {"enabled": True, "max_dp_gap": 0.2, "warmup_rows": 4, "tilt": True}},
        "evaluate_privacy": True, "use_ray": True,
    }
    cfg.update(over)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    return path


def finished_dpfair_run(tmp_path: Path) -> tuple[Path, Path, list[tuple]]:
    """The run through ray_jobs.dpfair's runner, every Ray task call recorded: (run dir, config, calls)."""
    import ray_jobs.dpfair as dpfair
    from dpsynth_core.tabular.config import load_dpfair_config
    from dpsynth_core.tabular.pipeline import run_dpfair

    path = tiny_dpfair_config(tmp_path)
    calls: list[tuple] = []

    def recording_runner(fn, *args):
        calls.append(args)
        return dpfair.ray_runner(fn, *args)

    return run_dpfair(load_dpfair_config(path), runner=recording_runner), path, calls
