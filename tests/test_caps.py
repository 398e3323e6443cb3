"""Caps (issue 19, item 6): every size knob has an upper bound checked at config load, before any
DP stage; the privacy calculators answer or refuse within seconds."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from dpsynth_core.config import caps_of
from cli_in_process import dpsynth
from dpsynth_core.errors import ConfigError

# Integer/float knobs that scale work or memory: each must carry a cap (dpsynth_core.config.cap).
SIZE_KNOB = re.compile(r"^(n|q|r|bins)$|^n_|^num_|_rows$|steps$|iterations|batch_size|max_new_tokens|max_seq_len|"
                       r"max_chars|group_size|per_class|per_user|max_workers|threads|parties|attempts|"
                       r"max_text_tokens|warmup")
NOT_SIZES = {"stop_after_steps", "checkpoint_every"}  # test-only / frequency knobs, not sizes


def config_classes() -> list[type[BaseModel]]:
    from dpsynth_core.actg.pipeline import ActgConfig
    from dpsynth_core.dpsgd.train_job import TrainJobConfig
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.tabular.config import AimConfig, DpFairConfig
    from ray_jobs.batch_generate import BatchGenerateConfig

    return [ActgConfig, PEConfig, DpFairConfig, AimConfig, TrainJobConfig, BatchGenerateConfig]


def size_knobs(cls: type[BaseModel], prefix: str = "") -> list[str]:
    """Dotted paths of the numeric fields of ``cls`` (and nested configs) named like a size."""
    from dpsynth_core.config.strict import _config_types

    out = []
    for name, field in cls.model_fields.items():
        nested = _config_types(field.annotation)
        if nested:
            for sub in nested:
                out += size_knobs(sub, f"{prefix}{name}.")
        elif SIZE_KNOB.search(name) and name not in NOT_SIZES and re.search(r"\b(int|float)\b", str(field.annotation)):
            out.append(prefix + name)
    return out


@pytest.mark.parametrize("cls", config_classes(), ids=lambda c: c.__name__)
def test_every_size_knob_has_a_cap(cls):
    knobs = size_knobs(cls)
    assert knobs, "the walk found no size knob: the test would check nothing"
    missing = [k for k in knobs if k not in caps_of(cls)]
    assert not missing, f"{cls.__name__}: size knobs without a cap: {missing}"


def test_actg_generator_dict_is_capped_by_its_dpsgd_fields(tmp_path):
    from dpsynth_core.actg.pipeline import load_actg_config

    cfg = tmp_path / "a.yaml"
    cfg.write_text(yaml.safe_dump({"generator": {"steps": 10**9}}))
    with pytest.raises(ConfigError, match=r"field 'generator\.steps': at most 100,000"):
        load_actg_config(cfg)

def test_best_of_n_100000_refused_before_any_stage(tmp_path, monkeypatch, capsys):
    run_dir = tmp_path / "run"
    cfg = tmp_path / "actg.yaml"
    cfg.write_text(yaml.safe_dump({"run_dir": str(run_dir), "best_of_n": {"n": 100000}}))
    code, out = dpsynth(monkeypatch, capsys, "run", "actg", "--config", str(cfg))
    assert code != 0
    assert "field 'best_of_n.n': at most 64 (candidates generated" in out
    assert not run_dir.exists()


@pytest.mark.parametrize("args", [
    ["calibrate", "--epsilon", "1e6", "--delta", "1e-5", "-q", "0.01", "-T", "1000"],
    ["epsilon", "-q", "0.01", "-s", "0.02", "-T", "1000", "--delta", "1e-5"],
], ids=["calibrate-eps-1e6", "epsilon-sigma-0.02"])
def test_privacy_calculators_answer_within_seconds(monkeypatch, capsys, args):
    from dpsynth_core.privacy import epsilon_dpsgd

    epsilon_dpsgd(0.01, 1.0, 10, 1e-5, "pld")  # import dp_accounting first: its import time is not measured
    start = time.perf_counter()
    code, out = dpsynth(monkeypatch, capsys, "privacy", *args, "--time-limit", "5")
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert (code == 0 and re.search(r"noise_multiplier: \d|rdp\s.*\d", out)) or (code == 2 and "gave up" in out), out


def test_privacy_calibrate_gives_up_at_its_time_limit(monkeypatch, capsys):
    from dpsynth_core.privacy import epsilon_dpsgd

    epsilon_dpsgd(0.01, 1.0, 10, 1e-5, "pld")
    start = time.perf_counter()
    code, out = dpsynth(monkeypatch, capsys, "privacy", "calibrate", "--epsilon", "2", "--delta", "1e-6", "-q", "0.5",
                        "-T", "1000000", "--accountant", "prv", "--time-limit", "1")
    assert time.perf_counter() - start < 10
    assert code == 2 and "gave up after 1 s (prv accountant" in out


def test_privacy_steps_out_of_range_refused_with_the_range(monkeypatch, capsys):
    code, out = dpsynth(monkeypatch, capsys, "privacy", "epsilon", "-q", "0.01", "-s", "1", "-T", "100000000",
                        "--delta", "1e-5")
    assert code == 2 and "--steps must be in [1, 10,000,000]" in out
