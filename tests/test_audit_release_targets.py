"""The release-audit targets of ACTG and DPFairLLM (issue 39), without running their models: each builds the
config's own stage list for the audit run with the mode applied, refuses the test-only modes without the flag,
and hands the mechanism a working set that holds every included canary. Their full audits (tiny models, minutes
each) run from `make audit-text` / `make audit-table`, outside the suite; figures in docs/results/release_audit.md.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dpsynth.api.audit import ActgTarget, DpFairTarget, release_target
from dpsynth_core.audit.release_run import run_release_audit
from dpsynth_core.audit.release_settings import ReleaseAuditSettings
from dpsynth_core.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent
AUDITED = {"actg": ("audit_release_actg.yaml", "private"), "dpfair": ("audit_release_dpfair.yaml", "model")}


def _target(method: str):
    import yaml

    from dpsynth.api.methods import METHODS
    from dpsynth_core.config.paths import resolve_input_paths

    path = REPO / "configs" / AUDITED[method][0]
    raw = resolve_input_paths(yaml.safe_load(path.read_text())["run"], path.parent)
    return release_target(method, METHODS[method].from_dict(raw).config)


def _audit_file(target, tmp_path: Path, canaries: int = 60):
    """The audit file as the loop builds it: records + the included half of the canaries (OS entropy)."""
    design = target.design(ReleaseAuditSettings(canaries=canaries))
    records = target.private_records()
    rng = np.random.default_rng()
    drawn = design.draw(canaries, records, rng)
    included = rng.random(canaries) < 0.5
    members = drawn[included] if design.kind == "table" else [c for c, keep in zip(drawn, included) if keep]
    combined = design.combine(records, members, rng)
    if isinstance(target, ActgTarget):
        return target.write_audit_file(combined, tmp_path), records, members
    path = tmp_path / "audit.csv"
    combined.to_csv(path, index=False)
    return path, records, members


@pytest.mark.parametrize("method", sorted(AUDITED))
def test_the_audit_run_is_the_configs_stage_list_with_the_mode_applied(method, tmp_path):
    target = _target(method)
    data_file, records, members = _audit_file(target, tmp_path)
    public_size = len(records) + 30
    own = [s.name for s in target.audit_method(data_file, public_size, tmp_path, "dp").inner.stages()
           if not s.after_release]
    dp_stage = AUDITED[method][1]
    for mode in ("dp", "dp_off", "broken_release"):
        method_ = target.audit_method(data_file, public_size, tmp_path, mode)
        cfg, names = method_.config, [s.name for s in method_.stages()]
        assert dp_stage in names and Path(method_.run_dir()).is_relative_to(tmp_path)
        assert cfg.data.sample_fraction == 1.0  # the whole file is the working set
        plan = method_.privacy_plan()
        assert plan.public_size == public_size  # fixed before any canary was drawn, never the drawn size
        if mode == "dp":
            assert names == own and not cfg.is_reference and plan.epsilon == target.claimed_epsilon == 1.0
        elif mode == "dp_off":  # the method's own epsilon = inf reference run: no noise, no clipping, marked
            assert names == own and cfg.is_reference and cfg.not_private and plan.epsilon == float("inf")
        else:  # the leak runs last, after the stage that writes the synthetic output, before release/
            assert names == own + ["broken_release"] and not cfg.is_reference
            assert method_.stages()[-1].reads_private


@pytest.mark.parametrize("method", sorted(AUDITED))
def test_test_only_modes_are_refused_without_the_flag(method, tmp_path):
    target = _target(method)
    for mode in ("dp_off", "broken_release"):
        with pytest.raises(ConfigError, match="test-only"):
            run_release_audit(target, ReleaseAuditSettings(mode=mode), tmp_path / "a")
        assert not (tmp_path / "a").exists()  # refused before anything was written


def test_every_included_canary_reaches_actgs_working_set(tmp_path):
    """ACTG holds out evaluation rows by a content key first: the audit file keeps the config's held-out rows and
    redraws a canary that the holdout would take, so the working set is exactly records + included canaries."""
    from dpsynth_core.actg.data_split import load_private_split

    target = _target("actg")
    # ~1 % of canaries would fall among the 16 held-out rows of 1,500: without the redraw, 500 included ones miss
    data_file, records, members = _audit_file(target, tmp_path, canaries=1000)
    cfg = target.audit_method(data_file, len(records) + 500, tmp_path, "dp").config
    split = load_private_split(cfg)
    assert members and sorted(split.private["text"]) == sorted(records + members)
    assert not set(split.held_out["text"]) & set(records + members)


def test_every_included_canary_reaches_dpfairs_working_set(tmp_path):
    from dpsynth_core.tabular import private_data

    target = _target("dpfair")
    data_file, records, members = _audit_file(target, tmp_path)
    cfg = target.audit_method(data_file, len(records) + 30, tmp_path, "dp").config
    rows = private_data.private_rows(cfg, cfg.run_dir(), first_stage=True)  # what the first DP stage draws
    assert len(members) and len(rows) == len(records) + len(members)
    keys = set(map(tuple, rows.astype(str).to_numpy()))
    assert set(map(tuple, members.astype(str).to_numpy())) <= keys


def test_actg_audits_need_a_text_extractor():
    from dpsynth_core.actg.config import ActgConfig

    with pytest.raises(ConfigError, match="text extractor"):
        ActgTarget(ActgConfig.model_validate({"mode": "vanilla"}))
    assert isinstance(_target("dpfair"), DpFairTarget)
