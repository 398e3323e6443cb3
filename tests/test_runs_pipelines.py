"""One rerun rule (runs/run_dir.py) and one run lock (runs/lock.py) in ACTG and WASP / Aug-PE: a finished run
says so and runs nothing, a changed config is refused naming the keys, a locked run is refused.
No model runs here: the finished and refused paths stop before any stage."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from dpsynth_core.errors import ConfigError
from dpsynth_core.runs.lock import RunLockedError

REPO = Path(__file__).resolve().parent.parent


def _no_stage(*args, **kwargs):
    pytest.fail("a finished run must not run a stage")


def _actg(tmp_path: Path, **over):
    from dpsynth_core.actg.pipeline import ActgConfig

    return ActgConfig(run_dir=str(tmp_path / "actg"), **over)


def test_actg_changed_config_is_refused_naming_the_keys_and_test_knobs_are_not_identity(tmp_path):
    from dpsynth_core.actg.pipeline import prepare_run_dir

    root = prepare_run_dir(_actg(tmp_path, stop_after_stage="schema"), resume=True)
    saved = (root / "config.yaml").read_text()
    assert prepare_run_dir(_actg(tmp_path), resume=True) == root  # stop_after_stage is a test knob
    with pytest.raises(ConfigError, match=r"changed: privacy\.epsilon\).*--fresh"):
        prepare_run_dir(_actg(tmp_path, privacy={"epsilon": 1.0}), resume=True)
    assert (root / "config.yaml").read_text() == saved  # never overwritten by a refused rerun


def test_actg_finished_run_says_so_and_runs_nothing(tmp_path, capsys):
    from dpsynth_core.actg.pipeline import RunDir, prepare_run_dir, run_pipeline
    from dpsynth_core.runs.release import release_dir

    cfg = _actg(tmp_path)
    root = prepare_run_dir(cfg, resume=True)
    for stage in cfg.stages:
        RunDir(root).mark(stage, {})
    release_dir(root).mkdir()
    assert run_pipeline(cfg, runner=_no_stage) == root
    assert "already finished" in capsys.readouterr().err
    assert not (root / "ledger.sqlite").exists()  # nothing opened, nothing charged


def _pe_config(tmp_path: Path, **over) -> Path:
    raw = {"method": "wasp", "run_dir": str(tmp_path / "pe"), "data": {"classes": ["a", "b"], "num_private": 12},
           **over}
    path = tmp_path / "pe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_pe_finished_run_says_so_and_a_changed_config_is_refused(tmp_path, capsys):
    from dpsynth_core.pe.pipeline import load_pe_config, prepare_run_dir, run_pipeline
    from dpsynth_core.runs import StageMarkers

    path = _pe_config(tmp_path)
    root = prepare_run_dir(load_pe_config(path, "wasp"), resume=True)
    StageMarkers(root).mark("wasp")
    assert run_pipeline(path, "wasp", _no_stage) == root  # make_llms is never called
    assert "already finished" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"changed: privacy\.epsilon\).*--fresh"):
        run_pipeline(_pe_config(tmp_path, epsilon=1.0), "wasp", _no_stage)


def test_actg_and_pe_refuse_a_run_locked_by_another_process(tmp_path):
    from dpsynth_core.actg.pipeline import run_pipeline as run_actg
    from dpsynth_core.pe.pipeline import run_pipeline as run_pe

    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys
            from dpsynth_core.runs.lock import RunLock
            with RunLock(sys.argv[1]), RunLock(sys.argv[2]):
                print("held", flush=True)
                sys.stdin.readline()
            """), str(tmp_path / "actg"), str(tmp_path / "pe")],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held", holder.stderr.read()
        with pytest.raises(RunLockedError, match=rf"actg: another process .*pid {holder.pid}"):
            run_actg(_actg(tmp_path), runner=_no_stage)
        with pytest.raises(RunLockedError, match=rf"pe: another process .*pid {holder.pid}"):
            run_pe(_pe_config(tmp_path), "wasp", _no_stage)
    finally:
        holder.communicate("\n", timeout=60)
    assert not (tmp_path / "actg" / "config.yaml").exists()  # refused before the rerun rule wrote anything


def test_a_setting_added_after_the_run_was_made_and_left_unset_is_not_a_change(tmp_path):
    """A run interrupted before an upgrade resumes when the new version only adds settings left at None;
    a new setting given a value, or any changed one, is still refused."""
    from dpsynth_core.runs import changed_keys, open_run_dir

    old = {"generation": {"calibrate": {"enabled": True, "labels": "dp_tables"}}, "epsilon": 1.0}
    upgraded = {"generation": {"calibrate": {"enabled": True, "labels": "dp_tables", "stratify": None}}, "epsilon": 1.0}
    assert changed_keys(old, upgraded) == []
    assert changed_keys(old, {**upgraded, "generation": {"calibrate": {**upgraded["generation"]["calibrate"],
                                                                       "stratify": "sex"}}}) == ["generation.calibrate.stratify"]
    assert changed_keys(upgraded, old) == ["generation.calibrate.stratify"]  # a setting that went away is a change
    run = open_run_dir(tmp_path / "run", old, resume=True)
    assert open_run_dir(run, upgraded, resume=True) == run  # resumes
    with pytest.raises(ConfigError, match="changed: epsilon"):
        open_run_dir(run, {**upgraded, "epsilon": 2.0}, resume=True)
