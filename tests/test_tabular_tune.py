"""`dpsynth tune` for pipeline: dpfair: a search space whose trials are valid DPFairLLM configs, a
public sweep allowed, a private one refused with the reason."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from dpsynth_core.errors import ConfigError
from dpsynth_core.tabular.config import DpFairConfig
from dpsynth_core.tuning import TuningPrivacy, check_sweep_allowed

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("space_name", ["default", "tiny"])
def test_dpfair_space_gives_valid_trial_configs(tmp_path, space_name):
    from ray_jobs.sweep import SweepConfig, _search_space, trial_config

    cfg = SweepConfig(pipeline="dpfair", base_config=REPO / "configs" / "dpfair_tiny_test.yaml", metric="f1_gb",
                      space=space_name, privacy=TuningPrivacy(data="public"))
    space = _search_space(cfg)
    base = yaml.safe_load(cfg.base_config.read_text())
    for pick in (0, -1):  # the ends of every range / choice
        params = {k: (v.categories[pick] if hasattr(v, "categories") else (v.lower if pick == 0 else v.upper)) for k, v in space.items()}
        trial = DpFairConfig.model_validate(trial_config(base, {}, params, tmp_path / "trial"))
        assert trial.run_dir() == (tmp_path / "trial").resolve()
        assert trial.fairness.lambda_dp == params["fairness.lambda_dp"] and trial.fairness.lambda_eo == params["fairness.lambda_eo"]
        assert trial.fairness.attributes == ["sex", "race"]  # the base config's two sensitive attributes survive
    check_sweep_allowed(TuningPrivacy(data="public"), "random", "fifo", "dpfair", "f1_gb")


def test_private_dpfair_sweep_is_refused():
    with pytest.raises(ConfigError, match="reads private data|private"):
        check_sweep_allowed(TuningPrivacy(data="private", selection="random_trials", epsilon_budget=4.0), "random", "fifo", "dpfair", "f1_gb")


def test_trial_configs_find_the_schema_from_the_trial_directory(tmp_path, monkeypatch):
    """A trial's config lies in the trials directory and runs in Tune's trial directory: the base
    config's relative schema_path (bundled configs: relative to the repository root) must still resolve."""
    from dpsynth_core.config import load_config
    from dpsynth_core.tabular.schema import load_schema
    from ray_jobs.sweep import base_for_trials, trial_config

    monkeypatch.chdir(REPO)  # where `dpsynth tune` is started
    base = base_for_trials(REPO / "configs" / "dpfair_tiny_test.yaml")
    trial_dir = tmp_path / "trials" / "abc"
    trial_dir.mkdir(parents=True)
    path = tmp_path / "trials" / "abc.yaml"
    path.write_text(yaml.safe_dump(trial_config(base, {}, {"fairness.lambda_eo": 1.0}, trial_dir)))
    monkeypatch.chdir(tmp_path)  # Tune's trial directory
    cfg = load_config(path, DpFairConfig)
    assert load_schema(cfg.schema_path).target == "income" and cfg.fairness.lambda_eo == 1.0
