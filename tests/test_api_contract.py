"""The run contract, the config vocabulary and the Python API (issue 36, items 1-3).

* every YAML under configs/ (and the ones tests/ and experiments/ keep) loads through its class;
* a stage that records a DP event must say it reads private data;
* the README's API snippet, run for each method on a tiny config: ``run.ledger.epsilon`` is what
  ``dpsynth ledger show`` prints and ``run.release_dir`` verifies against the ledger.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
CONFIG_FOLDERS = ("configs", "tests/configs", "experiments/configs")  # users', tests' and experiments' configs


def _config_class(path: Path):
    from dpsynth.cli.audit import AuditJobConfig, ReleaseAuditJobConfig
    from dpsynth_core.actg.config import ActgConfig
    from dpsynth_core.dpsgd.train_job import TrainJobConfig
    from dpsynth_core.engines.config import EngineConfig
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.tabular.config import AimConfig, DpFairConfig
    from ray_jobs.batch_generate import BatchGenerateConfig
    from ray_jobs.sweep_trials import SweepConfig
    from serving.config import ServeConfig

    by_prefix = {"actg": ActgConfig, "wasp": PEConfig, "augpe": PEConfig, "dpfair": DpFairConfig, "aim": AimConfig,
                 "train": TrainJobConfig, "audit": AuditJobConfig, "engine": EngineConfig, "serve": ServeConfig,
                 "sweep": SweepConfig, "batch": BatchGenerateConfig, "audit_release": ReleaseAuditJobConfig}
    return by_prefix.get("_".join(path.stem.split("_")[:2])) or by_prefix[path.stem.split("_")[0]]


def test_every_bundled_config_loads_through_its_class(capsys):
    from dpsynth_core.config import load_config

    paths = sorted(p for folder in CONFIG_FOLDERS for p in (REPO / folder).glob("*.yaml"))
    for path in paths:
        load_config(path, _config_class(path))
    # issue 41 cut configs/ to one file per method and scale: fewer files, and every config class still has one
    assert len(paths) >= 30
    assert len({_config_class(p) for p in (REPO / "configs").glob("*.yaml")}) == 11  # the config classes (issue 39 added the release audit's)
    assert "is now" not in capsys.readouterr().err  # no bundled config uses an old key


@pytest.mark.parametrize("config, old, new", [
    ("wasp_tiny.yaml", ("data", "n_records", "num_private"), "data.n_records"),
    ("aim_tiny_test.yaml", ("data", "n_records", "train_rows"), "data.n_records"),
])
def test_the_working_set_size_has_one_name_and_the_old_ones_load_with_a_line(config, old, new, tmp_path, capsys):
    from dpsynth_core.config import load_config

    path = REPO / "configs" / config
    raw = yaml.safe_load(path.read_text())
    section, key, old_key = old
    raw[section][old_key] = raw[section].pop(key)
    renamed = tmp_path / config
    renamed.write_text(yaml.safe_dump(raw))
    assert load_config(renamed, _config_class(path)) == load_config(path, _config_class(path))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"key '{section}.{old_key}' is now '{new}'" in err


def test_dtype_is_spelled_one_way_and_the_short_aliases_load():
    from dpsynth_core.dpsgd import DpSgdConfig
    from dpsynth_core.config.placement import PlacementSettings

    assert DpSgdConfig(model="tiny-llama", epsilon=1.0, steps=1, dtype="bf16").dtype == "bfloat16"
    assert PlacementSettings(dtype="fp32").dtype == "float32" == PlacementSettings(dtype="float32").dtype


@pytest.mark.parametrize("config", ["actg_tiny.yaml", "wasp_tiny.yaml", "dpfair_tiny_test.yaml"])
def test_user_col_is_refused_where_the_method_protects_a_record(config, tmp_path):
    from dpsynth_core.config import load_config
    from dpsynth_core.errors import ConfigError

    path = REPO / "configs" / config
    raw = yaml.safe_load(path.read_text())
    raw["data"]["user_col"] = "author"
    bad = tmp_path / config
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"data\.user_col: this method protects one record"):
        load_config(bad, _config_class(path))


def test_a_stage_that_records_a_dp_event_must_read_private_data():
    from dpsynth_core.runs.contract import Stage

    with pytest.raises(ValueError, match="reads no private data"):
        Stage("votes", lambda cfg, root: {}, records=("gaussian",))
    with pytest.raises(ValueError, match="isolated"):
        Stage("rl", lambda cfg, root: {}, reads_private=True, isolated=True)
    assert Stage("generate", lambda cfg, root: {}, records=("post_processing",)).records == ("post_processing",)


class _Toy:
    """A method of two stages on no data: a Gaussian count (declared or not) and a release file."""

    @staticmethod
    def method(tmp_path: Path, epsilon: float = 1.0, declare: bool = True):
        from dpsynth_core.privacy import GaussianEvent, PrivacyLedger
        from dpsynth_core.runs.contract import Method, PrivacyPlan, Stage

        def count(cfg, root: str) -> dict:
            if epsilon != float("inf"):  # a reference run records no event
                PrivacyLedger.open(root).record("count", GaussianEvent(noise_multiplier=5.0, compositions=1))
            (Path(root) / "out.txt").write_text("42\n")
            return {"rows": 1}

        class Toy(Method):
            kind = "toy"

            def stages(self):
                return [Stage("count", count, records=("gaussian",) if declare else (), reads_private=True),
                        Stage("report", lambda cfg, root: {"owner_side": True}, after_release=True)]

            def run_dir(self):
                return tmp_path / "toy"

            def privacy_plan(self):
                return PrivacyPlan("toy", epsilon, None, 100)

            def release_items(self, root):
                return {"out.txt": root / "out.txt"}

            def identity(self):
                return {"epsilon": str(epsilon)}, ()

        return Toy(None)


def test_the_loop_owns_markers_ledger_release_and_the_rerun_rule(tmp_path, capsys):
    import json

    from dpsynth_core.privacy.release_check import verify_release
    from dpsynth_core.run_loop import run_method

    result = run_method(_Toy.method(tmp_path))
    marker = json.loads((result.run_dir / "stages" / "count.done").read_text())
    assert marker["rows"] == 1 and marker["ran_on"]["in_process"] and "seconds" in marker
    assert result.ledger.delta == 1e-5 and result.ledger.public_size == 100  # min(1e-5, 100^-1.1)
    manifest = verify_release(result.run_dir)
    assert set(manifest["files"]) == {"out.txt", "ledger.json", "ledger.txt"} and manifest["method"] == "toy"
    assert manifest["epsilon"] == pytest.approx(result.ledger.total_epsilon()) and not manifest["not_private"]
    capsys.readouterr()
    run_method(_Toy.method(tmp_path))  # finished: nothing runs, nothing is charged again
    assert "already finished" in capsys.readouterr().err and len(result.ledger.entries()) == 1


def test_an_infinite_epsilon_run_is_marked_not_private_in_ledger_and_release(tmp_path):
    from dpsynth_core.privacy.release_check import verify_release
    from dpsynth_core.run_loop import run_method

    result = run_method(_Toy.method(tmp_path, epsilon=float("inf")))
    assert not result.ledger.is_private and verify_release(result.run_dir)["not_private"]


def test_a_stage_that_records_an_undeclared_event_stops_the_run(tmp_path):
    from dpsynth_core.run_loop import run_method
    from dpsynth_core.runs.contract import UndeclaredPrivacyEvent

    with pytest.raises(UndeclaredPrivacyEvent, match="stage count recorded \\['gaussian'\\]"):
        run_method(_Toy.method(tmp_path, declare=False))
    assert not (tmp_path / "toy" / "stages" / "count.done").exists() and not (tmp_path / "toy" / "release").exists()


def _readme_snippet() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## Python API"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _tiny(tmp_path: Path, name: str, raw: dict) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _configs(tmp_path: Path) -> dict[str, tuple[str, Path]]:
    """Class name -> (tiny config file): the bundled tiny configs, smaller still, writing under tmp_path."""
    load = lambda name: yaml.safe_load((REPO / "configs" / name).read_text())  # noqa: E731
    actg = load("actg_tiny.yaml") | {"output_dir": str(tmp_path / "actg"), "mode": "vanilla",
                                     "evaluation": {"mauve": False, "classifier": False, "judge": "none"}}
    actg["generator"] = actg["generator"] | {"steps": 1}
    aim = load("aim_tiny_test.yaml") | {"output_dir": str(tmp_path / "runs" / "aim_tiny"), "columns": ["sex", "income"],
                                        "num_rows": 12, "evaluate_privacy": False}
    augpe = load("augpe_tiny.yaml") | {"output_dir": str(tmp_path / "augpe"), "iterations": 1, "num_synthetic": 6,
                                       "baselines": False}
    wasp = load("wasp_tiny.yaml") | {"output_dir": str(tmp_path / "wasp"), "iterations": 1, "baselines": False}
    wasp["plms"] = [plm | {"backend": "hf"} for plm in wasp["plms"]]  # in this process: no Ray
    dpfair = load("dpfair_tiny_test.yaml") | {"output_dir": str(tmp_path / "runs" / "dpfair_tiny"), "evaluate_privacy": False,
                                              "evaluate_reference": False}
    dpfair["generation"] = dpfair["generation"] | {"num_rows": 8, "batch_size": 8}
    dpfair["training"] = dpfair["training"] | {"steps": 1}
    train = load("train_tiny.yaml") | {"output_dir": str(tmp_path / "train")}
    train["train"] = train["train"] | {"steps": 1}
    train["data"] = train["data"] | {"max_records": 40}
    return {"ACTG": _tiny(tmp_path, "actg", actg), "AIM": _tiny(tmp_path, "aim", aim),
            "AugPE": _tiny(tmp_path, "augpe", augpe), "WASP": _tiny(tmp_path, "wasp", wasp),
            "DPFairLLM": _tiny(tmp_path, "dpfair", dpfair), "Train": _tiny(tmp_path, "train", train)}


@pytest.mark.parametrize("cls", ["ACTG", "WASP", "AugPE", "DPFairLLM", "AIM", "Train"])
def test_the_readme_api_snippet_runs_and_its_ledger_is_what_ledger_show_prints(cls, tmp_path, biorxiv_csv, adult_dir):
    from dpsynth.cli.main import cli_command
    from dpsynth_core.privacy.release_check import verify_release

    path = _configs(tmp_path)[cls]
    snippet = _readme_snippet().replace("ACTG", cls).replace('"configs/actg_tiny.yaml"', repr(str(path)))
    scope: dict = {}
    exec(compile(snippet, "README.md", "exec"), scope)  # noqa: S102 - the documented snippet itself
    run = scope["run"]
    shown = CliRunner().invoke(cli_command(), ["ledger", "show", str(run.ledger_dir)])
    assert shown.exit_code == 0, shown.output
    composed = float(re.search(r"composed: epsilon=([0-9.]+)", shown.output).group(1))
    assert round(run.ledger.epsilon, 4) == composed and 0 < composed <= 4.0 + 1e-9
    manifest = verify_release(run.ledger_dir)
    assert run.release_dir.is_dir() and manifest["epsilon"] == pytest.approx(run.ledger.epsilon)
