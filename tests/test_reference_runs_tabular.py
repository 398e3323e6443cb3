"""epsilon = inf reference runs of DPFairLLM and AIM (issue 36): the same stages without noise, marked
NOT PRIVATE in the ledger, the release manifest and the stage summary, and never released as private."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent


def _tiny(name: str, tmp_path: Path, **over) -> dict:
    raw = yaml.safe_load((REPO / "configs" / name).read_text())
    return raw | {"output_dir": str(tmp_path / "runs"), "evaluate_privacy": False} | over


def _assert_reference(run, tmp_path: Path, dp_stages: set[str]) -> None:
    from dpsynth.cli.main import cli_command

    from dpsynth_core.privacy import PrivacyLedger

    ledger = run.ledger
    # no DP event (there is no finite epsilon to record); generation's zero-cost post-processing entry only
    assert not ledger.is_private and all(kind == "post_processing" for _, kind, _ in ledger.stages)

    marked = {m["stage"] for m in PrivacyLedger.open(run.ledger_dir).not_private_reasons()}
    assert dp_stages <= marked  # each noiseless stage says what it switched off
    manifest = run.verify()
    assert manifest["not_private"] and manifest["epsilon"] is None
    summary = json.loads((run.run_dir / "stages" / "evaluate.done").read_text())
    assert summary["not_private"] and summary["epsilon"] is None
    shown = CliRunner().invoke(cli_command(), ["ledger", "show", str(run.ledger_dir)])
    assert shown.exit_code == 0 and "NOT PRIVATE" in shown.output
    released = CliRunner().invoke(cli_command(), ["release", str(run.run_dir), str(tmp_path / "published")])
    assert released.exit_code == 0, released.output
    assert "NOT PRIVATE" in released.output and "epsilon 0" not in released.output


def test_epsilon_inf_is_refused_without_not_private(tmp_path):
    from dpsynth import AIM, DPFairLLM
    from dpsynth_core.errors import ConfigError

    for cls, name in ((AIM, "aim_tiny_test.yaml"), (DPFairLLM, "dpfair_tiny_test.yaml")):
        with pytest.raises(ConfigError, match="not_private: true"):
            cls.from_dict(_tiny(name, tmp_path, privacy={"epsilon": math.inf}))
        with pytest.raises(ConfigError, match="only for reference runs"):
            cls.from_dict(_tiny(name, tmp_path, not_private=True))


def test_aim_reference_run_resamples_the_rows_and_is_marked_not_private(tmp_path, adult_dir):
    from dpsynth import AIM

    run = AIM.from_dict(_tiny("aim_tiny_test.yaml", tmp_path, columns=["capital_loss", "sex", "income"], num_rows=12)
                        ).as_reference().run()
    _assert_reference(run, tmp_path, {"aim.reference", "dp_domain", "aim_baseline"})
    synth = (run.release_dir / "synthetic.csv").read_text().splitlines()
    assert len(synth) == 13 and synth[0] == "capital_loss,sex,income"


def test_dpfair_reference_run_trains_without_noise_and_is_marked_not_private(tmp_path, adult_dir):
    from dpsynth import DPFairLLM

    raw = _tiny("dpfair_tiny_test.yaml", tmp_path, evaluate_reference=False)
    raw["generation"] |= {"num_rows": 8, "batch_size": 8}
    raw["training"] |= {"steps": 1}
    run = DPFairLLM.from_dict(raw).as_reference().run()
    _assert_reference(run, tmp_path, {"dpfairllm.reference", "dp_fair_stats", "dpsgd"})
    trained = json.loads((run.run_dir / "train" / "adapter" / "dp_training.json").read_text())
    assert trained["noise_multiplier"] == 0.0 and trained["clipping"] == "none"
    targets = json.loads((run.release_dir / "fair_targets.json").read_text())
    assert targets  # the (A, Y) tables were counted exactly and written for generation
