"""Quiet, informative output (issue 19, item 8): a pipeline run through the CLI shows no model-loading
bars, library warnings or Ray notices (in the driver or in Ray workers), and ends with a summary:
absolute run directory, epsilon spent of the budget at delta, stages run / skipped / resumed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import yaml

from dpsynth_core.quiet import _QUIET_ENV

UNWANTED = [
    "Loading weights", "Loading checkpoint shards",  # transformers' model-loading bars
    "FutureWarning", "DeprecationWarning",
    "Token authentication is enabled",  # Ray's notice on every local start
    "Usage stats collection", "Started a local Ray instance",
    "{'loss'",  # a Trainer's raw metric dict
    "Triton",  # vLLM's import-time notice on a CPU host (logged before vLLM configures its loggers)
    "TRL currently supports vLLM",  # trl's version check of the installed vLLM
    "WARNING:dpsynth_core",  # our own notices are plain lines, whatever a library did to the root logger
]


def _user_env() -> dict[str, str]:
    """The environment of a user's shell: none of the quieting variables preset (the suite sets some)."""
    env = {k: v for k, v in os.environ.items() if k not in _QUIET_ENV and not k.startswith("RAY_ADDRESS")}
    env.pop("DPSYNTH_VERBOSE", None)
    return env


def test_pipeline_run_is_quiet_and_ends_with_a_summary(tmp_path, biorxiv_csv):
    run_dir = tmp_path / "runs" / "augpe"
    config = {
        "method": "augpe", "output_dir": str(run_dir),
        "data": {"source": "biorxiv", "classes": ["neuroscience", "bioinformatics"], "num_private": 6, "num_test": 0},
        # a Ray actor backend: the run starts a local Ray, so Ray's notices and worker output are exercised
        "plms": [{"model": "tiny-llama", "name": "tiny-a", "backend": "ray_actor", "seed": 1, "batch_size": 8}],
        "epsilon": 2.0, "iterations": 1, "num_synthetic": 4, "max_new_tokens": 4, "seed": 0, "evaluate": False,
    }
    path = tmp_path / "augpe.yaml"
    path.write_text(yaml.safe_dump(config))
    res = subprocess.run([sys.executable, "-m", "dpsynth", "run", "augpe", "--config", str(path)],
                         capture_output=True, text=True, timeout=600, env=_user_env(), cwd=tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    for line in UNWANTED:
        assert line not in out, f"{line!r} in the output:\n{out[-3000:]}"
    assert f"run directory: {run_dir.resolve()}" in res.stdout
    privacy = re.search(r"privacy: epsilon (\S+) of budget 2 spent at delta 1e-05 \((\S+) by this invocation\)",
                        res.stdout)
    assert privacy, res.stdout
    assert 0 < float(privacy.group(1)) <= 2.0 and privacy.group(1) == privacy.group(2)
    stages = re.search(r"^stages run: (.*)$", res.stdout, flags=re.M)
    assert stages and "iteration 0, iteration 1" in stages.group(1), res.stdout  # nothing skipped: a fresh run


def test_summary_says_what_was_resumed_and_skipped(tmp_path):
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.privacy.events import GaussianEvent
    from dpsynth_core.run_loop.summary import summary_lines

    ledger = PrivacyLedger.create(tmp_path, "toy", epsilon_budget=4.0, delta=1e-6)
    ledger.record("features", GaussianEvent(noise_multiplier=2.0))
    spent_before = ledger.total_epsilon()
    stages = tmp_path / "stages"
    stages.mkdir()
    for name in ("schema", "features"):
        (stages / f"{name}.done").write_text("{}")
        os.utime(stages / f"{name}.done", (time.time() - 3600, time.time() - 3600))
    started = time.time() + 5  # the ledger event above is from "before" this invocation
    lines = summary_lines(tmp_path, started)
    assert lines[0] == f"run directory: {tmp_path.resolve()}"
    assert f"epsilon {spent_before:.3f} of budget 4 spent at delta 1e-06 (0.000 by this invocation)" in lines[1]
    assert lines[2] == "stages: all 2 already done, none run (--fresh starts over)"

    (stages / "dp_generator.done").write_text("{}")
    os.utime(stages / "dp_generator.done", (started + 1, started + 1))
    assert summary_lines(tmp_path, started)[2] == (
        "stages: resumed; run now: dp_generator; skipped (already done): features, schema")


def test_trainer_metric_dicts_are_not_printed(tmp_path, capsys):
    """trl's RLOOTrainer logs every step through these callbacks; quiet_trainer drops the raw dicts."""
    from transformers import TrainerControl, TrainerState
    from transformers.trainer_callback import CallbackHandler, PrinterCallback, ProgressCallback

    from dpsynth_core.quiet import quiet_trainer

    args = None  # these two callbacks read only the state
    state, control = TrainerState(), TrainerControl()
    state.max_steps = 1

    def logged_output(handler) -> str:
        handler.on_train_begin(args, state, control)
        handler.on_log(args, state, control, {"loss": 1.25, "reward": 0.5})
        handler.on_train_end(args, state, control)
        captured = capsys.readouterr()
        return captured.out + captured.err

    loud = CallbackHandler([PrinterCallback(), ProgressCallback()], None, None, None, None)
    assert "'loss'" in logged_output(loud)  # what a trl run printed every step
    quiet = CallbackHandler([PrinterCallback(), ProgressCallback()], None, None, None, None)
    quiet_trainer(quiet)
    assert "'loss'" not in logged_output(quiet)


def test_serve_ray_llm_and_ray_data_logs_are_quiet_unless_verbose(monkeypatch):
    """`dpsynth serve start` printed Serve's deployment-options dumps, replica starts, one access line per
    request and Ray LLM's setup steps ("No cloud storage mirror configured", from a task it starts), and
    `dpsynth generate` on the ray_data_llm runner 150 lines (Ray Data's plan, Ray LLM's steps, vLLM's
    warnings): quiet runs give Serve's components ERROR, Ray LLM's loggers WARNING, Ray Data's driver
    logger ERROR; DPSYNTH_VERBOSE=1 keeps Ray's defaults."""
    import logging

    from ray.llm._internal.common.observability.logging import get_logger

    from dpsynth_core.quiet import ray_worker_setup
    from ray_jobs.ray_llm_batch import keep_ray_quiet
    from serving.app import serve_logging

    serve_logger, llm_logger = logging.getLogger("ray.serve"), logging.getLogger("ray.llm")
    ray_logger, data_logger = logging.getLogger("ray"), logging.getLogger("ray.data")
    saved = serve_logger.level, llm_logger.level, list(llm_logger.handlers), ray_logger.level, data_logger.level
    try:
        llm_logger.handlers[:] = []  # as a fresh process has it (another test may have quieted this one)
        llm_logger.setLevel(logging.NOTSET)
        monkeypatch.setenv("DPSYNTH_VERBOSE", "1")
        monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
        assert serve_logging() is None
        ray_worker_setup()
        assert not llm_logger.handlers  # Ray LLM still sets its own INFO handler up when verbose

        monkeypatch.delenv("DPSYNTH_VERBOSE")
        monkeypatch.setenv("VLLM_LOGGING_LEVEL", "ERROR")  # what quiet_env gives every worker
        assert serve_logging() == {"log_level": "ERROR", "enable_access_log": False}
        assert serve_logger.getEffectiveLevel() == logging.WARNING
        ray_worker_setup()
        setup_step = get_logger("dpsynth_quiet_check")  # a Ray LLM module's logger, made after the hook ran
        assert not setup_step.isEnabledFor(logging.INFO) and setup_step.isEnabledFor(logging.WARNING)
        assert not setup_step.handlers  # no INFO console handler of its own: WARNING and up reach root's
        # Ray Data's plan / start / end lines, and Ray's logger after Ray LLM's batch processor re-ran ray.init()
        ray_logger.setLevel(logging.INFO)
        keep_ray_quiet()
        assert ray_logger.level == logging.WARNING and data_logger.level == logging.ERROR
    finally:
        serve_logger.setLevel(saved[0])
        llm_logger.setLevel(saved[1])
        llm_logger.handlers[:] = saved[2]
        ray_logger.setLevel(saved[3])
        data_logger.setLevel(saved[4])
