"""One run-location rule (issue 36): the run directory is ``output_dir`` for every method.

* a config whose run an older release left in ``output_dir/name`` is refused (one line naming both paths and
  the key to set, exit 2, nothing written): rerun in the new place it would spend its budget again;
* two configs cannot share one run directory by accident: the second is refused by the rerun rule.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from dpsynth_core.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent


def _aim(tmp_path: Path, **over) -> dict:
    raw = yaml.safe_load((REPO / "configs" / "aim_tiny_test.yaml").read_text())
    return raw | {"output_dir": str(tmp_path / "runs"), "schema_path": str(REPO / "configs" / "schemas" / "adult.yaml")} | over


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("left", ["config.yaml", "ledger.sqlite", "stages/prepare.done"])
def test_a_run_left_in_output_dir_name_is_refused_naming_both_paths_and_the_key(tmp_path, monkeypatch, capsys, left):
    from dpsynth.cli.main import app
    from dpsynth_core.config import load_config
    from dpsynth_core.run_loop import run_method
    from dpsynth_core.tabular.aim_run import AimMethod
    from dpsynth_core.tabular.config import AimConfig

    raw = _aim(tmp_path)
    path = tmp_path / "aim.yaml"
    path.write_text(yaml.safe_dump(raw))
    old = (tmp_path / "runs" / raw["name"]).resolve()  # where the older release put this config's run
    (old / left).parent.mkdir(parents=True, exist_ok=True)
    (old / left).write_text("{}")
    before = _tree(tmp_path)
    monkeypatch.setattr(sys, "argv", ["dpsynth", "run", "aim", "--config", str(path)])
    with pytest.raises(SystemExit) as exit_:
        app()
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1
    assert f"set output_dir: {old} to continue that run" in err and f"({old.parent})" in err
    assert _tree(tmp_path) == before  # nothing written, the old run untouched
    for resume in (True, False):  # the API too; --fresh would move every run under output_dir aside
        with pytest.raises(ConfigError, match="set output_dir: "):
            run_method(AimMethod(load_config(path, AimConfig)), resume=resume)
    assert _tree(tmp_path) == before


def test_two_configs_cannot_share_one_run_directory(tmp_path):
    from dpsynth_core.run_loop import run_method
    from dpsynth_core.runs import open_run_dir
    from dpsynth_core.tabular.aim_run import AimMethod
    from dpsynth_core.tabular.config import AimConfig

    first = AimMethod(AimConfig.model_validate(_aim(tmp_path, name="first")))
    second = AimMethod(AimConfig.model_validate(_aim(tmp_path, name="second")))
    assert first.run_dir() == second.run_dir() == (tmp_path / "runs").resolve()
    open_run_dir(first.run_dir(), first.identity()[0], resume=True)  # the first config's run, begun
    before = _tree(tmp_path)
    with pytest.raises(ConfigError, match=r"different config \(changed: name\)"):
        run_method(second)
    assert _tree(tmp_path) == before


def test_a_run_begun_with_two_torch_threads_resumes_under_the_cpus_given_default(tmp_path):
    """torch_threads (default 2 before, now the CPUs a stage was given) says how a run executes, not what it is:
    a run begun with the old default reopens, with no "different config" refusal, for ACTG and DPFairLLM."""
    from dpsynth_core.actg.pipeline import ActgMethod, load_actg_config
    from dpsynth_core.runs import open_run_dir
    from dpsynth_core.tabular.config import DpFairConfig
    from dpsynth_core.tabular.pipeline import DpFairMethod

    repo = Path(__file__).resolve().parent.parent
    actg = load_actg_config(repo / "configs" / "actg_tiny.yaml").model_copy(update={"run_dir": str(tmp_path / "actg")})
    dpfair = DpFairConfig.model_validate(yaml.safe_load((repo / "configs" / "dpfair_tiny_test.yaml").read_text())
                                         | {"output_dir": str(tmp_path / "dpfair")})
    cases = ((ActgMethod(actg), {"torch_threads": 2}), (DpFairMethod(dpfair), {"training": {"torch_threads": 2}}))
    for method, old in cases:
        snapshot, ignore = method.identity()
        assert yaml.safe_dump(snapshot).count("torch_threads: null") == 1  # the new default
        begun = {**snapshot, **{k: ({**snapshot[k], **v} if isinstance(v, dict) else v) for k, v in old.items()}}
        open_run_dir(method.run_dir(), begun, resume=True, ignore=ignore)
        assert open_run_dir(method.run_dir(), snapshot, resume=True, ignore=ignore) == method.run_dir()
