"""Keys that moved (issue 36): `dpsynth train`'s budget under `privacy:` and the device under `placement:` like
every method's, `resources` for PE and train, and an unfinished run made before a key moved is refused in one line
that names --fresh (exit 2), never resumed silently (a finished one stays finished)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


def test_train_epsilon_loads_from_its_old_place_with_one_line(tmp_path, capsys):
    from dpsynth_core.config import load_config
    from dpsynth_core.dpsgd.train_job import TrainJobConfig

    path = REPO / "configs" / "train_tiny.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["train"]["epsilon"] = raw.pop("privacy")["epsilon"]
    old = tmp_path / "train_old.yaml"
    old.write_text(yaml.safe_dump(raw))
    loaded = load_config(old, TrainJobConfig)
    assert loaded == load_config(path, TrainJobConfig) and loaded.train.epsilon == loaded.epsilon == 2.0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "key 'train.epsilon' is now 'privacy.epsilon'" in err
    raw["privacy"] = {"epsilon": 1.0}
    old.write_text(yaml.safe_dump(raw))
    with pytest.raises(Exception, match=r"give 'privacy.epsilon' only"):
        load_config(old, TrainJobConfig)


def test_a_run_made_before_a_key_moved_is_refused_naming_fresh_unless_it_finished(tmp_path, monkeypatch, capsys):
    from dpsynth.cli.main import app
    from dpsynth_core.config import load_config
    from dpsynth_core.tabular.config import AimConfig

    raw = yaml.safe_load((REPO / "configs" / "aim_tiny_test.yaml").read_text())
    raw |= {"output_dir": str(tmp_path / "runs" / raw["name"]), "schema_path": str(REPO / "configs" / "schemas" / "adult.yaml")}
    path = tmp_path / "aim.yaml"
    path.write_text(yaml.safe_dump(raw))
    old = load_config(path, AimConfig).model_dump(mode="json")
    old |= {"epsilon": old["privacy"]["epsilon"], "delta": None}  # the snapshot before the budget moved
    del old["privacy"]
    run = tmp_path / "runs" / raw["name"]
    (run / "stages").mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(old))
    monkeypatch.setattr(sys, "argv", ["dpsynth", "run", "aim", "--config", str(path)])
    with pytest.raises(SystemExit) as exit_:
        app()
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert "before its config keys moved (epsilon -> privacy.epsilon, delta -> privacy.delta)" in err
    assert "rerun with --fresh" in err
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "stages"]  # nothing written
    # finished before the keys moved: its outputs stand, nothing runs (never "--fresh", which spends again)
    from dpsynth_core.run_loop import run_method
    from dpsynth_core.tabular.aim_run import AimMethod

    for stage in ("prepare", "aim", "evaluate"):
        (run / "stages" / f"{stage}.done").write_text("{}")
    run_method(AimMethod(load_config(path, AimConfig)))
    assert "already finished" in capsys.readouterr().err and not (run / "ledger.sqlite").exists()


def test_dpfair_training_and_generation_devices_are_one_placement(tmp_path, capsys):
    from dpsynth_core.config import load_config
    from dpsynth_core.tabular.config import DpFairConfig

    raw = yaml.safe_load((REPO / "configs" / "dpfair_tiny_test.yaml").read_text())
    raw["schema_path"] = str(REPO / raw["schema_path"])
    raw["training"] |= {"device": "cpu", "dtype": "fp32"}
    raw["generation"] |= {"device": "cpu"}
    path = tmp_path / "dpfair.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path, DpFairConfig)
    assert (cfg.placement.device, cfg.placement.dtype) == ("cpu", "float32")
    err = capsys.readouterr().err
    assert err.count("\n") == 3 and "key 'generation.device' is now 'placement.device'" in err
    raw["generation"]["device"] = "cuda"  # two old places that disagree: one placement cannot hold both
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(Exception, match="give 'placement.device' only"):
        load_config(path, DpFairConfig)


def test_train_placement_and_resources_reach_the_engine_and_ray_train(capsys):
    from dpsynth_core.dpsgd.train_job import TrainJobConfig
    from ray_jobs.dp_finetune import worker_request

    raw = yaml.safe_load((REPO / "configs" / "train_tiny.yaml").read_text())
    old = TrainJobConfig.model_validate({**raw, "train": {**raw["train"], "device": "cpu", "dtype": "bf16"}})
    new = TrainJobConfig.model_validate({**raw, "placement": {"device": "cpu", "dtype": "bfloat16"},
                                         "resources": {"cpus": 2, "gpus": 1}})
    assert (old.train.device, old.train.dtype) == (new.train.device, new.train.dtype) == ("cpu", "bfloat16")
    assert "device" not in new.snapshot()["train"] and new.snapshot()["placement"]["device"] == "cpu"
    assert worker_request(new.train, new.resources) == (True, {"CPU": 2.0, "GPU": 1.0})
    assert worker_request(old.train, old.resources) == (False, None)  # unset: Ray Train's default


def test_pe_resources_are_every_ray_plms_default():
    from dpsynth_core.pe.config import PEConfig

    raw = yaml.safe_load((REPO / "configs" / "wasp_tiny.yaml").read_text())
    raw["resources"] = {"cpus": 1, "memory_gb": 2}
    raw["plms"][0]["resources"] = {"cpus": 2}
    first, second = PEConfig.model_validate(raw).plms
    assert (first.resources.cpus, first.resources.memory_gb) == (2, 2) and second.resources.cpus == 1
    raw["resources"] = {"gpus": 0}
    raw["plms"][1]["device"] = "cuda"  # a GPU PLM that the run's default would hide the GPU from
    with pytest.raises(Exception, match="Ray hides GPUs"):
        PEConfig.model_validate(raw)


def test_actg_and_pe_placement_is_every_stages_default_and_a_stage_may_override_it():
    from dpsynth_core.actg.config import ActgConfig
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.runs.run_dir import changed_keys

    cfg = ActgConfig(placement={"device": "cpu", "dtype": "bf16"}, generation={"device": "cuda"})
    assert (cfg.generation.device, cfg.generation.dtype) == ("cuda", "bfloat16")  # its own device, the dtype
    assert (cfg.rl.device, cfg.extractor.device, cfg.generator["device"]) == ("cpu", "cpu", "cpu")
    raw = yaml.safe_load((REPO / "configs" / "wasp_tiny.yaml").read_text())
    raw["plms"][1]["device"] = "cuda"
    plms = PEConfig.model_validate({**raw, "placement": {"device": "cpu"}}).plms
    assert [p.device for p in plms] == ["cpu", "cuda"]
    # unset, the new keys leave a run made before them the same run (the rerun rule sees no change)
    snapshot = PEConfig.model_validate(raw).model_dump(mode="json")
    before = {k: v for k, v in snapshot.items() if k not in ("placement", "resources")}
    assert changed_keys(before, snapshot) == []
