"""DPFairLLM end to end: stages, run directory, resume (Ray-free; ``ray_jobs/dpfair.py`` runs the
heavy stage as a Ray task through ``runner``).

    cfg = load_dpfair_config("configs/dpfair_demo.yaml")
    run_dir = run_dpfair(cfg)                        # every stage in this process
    run_dir = run_dpfair(cfg, runner=ray_runner)     # train + generate as a Ray task

Stages (each leaves ``stages/<name>.done``; a rerun skips finished stages)::

    prepare     draw the secret working subset of the private file (owner-only state); resolve the
                schema's `domain: dp` columns under DP (Gaussian histogram)   -> schema_resolved.json
    fair_stats  one DP (A, Y) table per sensitive attribute -> fairness targets (only with a fairness
                term)                                                          -> fair_targets.json
    marginals   DP 1-way marginals of every column (with public_stage.rows_from: dp_marginals or
                generation.calibrate)                                          -> dp_marginals.json
    train       stage 1 (optional, no private rows): LoRA on rows drawn from the public schema or the
                DP marginals, merged                                           -> public_stage.json;
                stage 2: DP-SGD LoRA fine-tuning with the fairness penalty (its equalized-odds
                constants renewed from rows the model generates)              -> train/ (adapter)
    generate    constrained, fairness-aware generation (post-processing); with generation.calibrate
                a larger pool raked to the DP marginals                        -> synthetic.csv
                                                                               (generated_pool.csv)
    release     release/: synthetic.csv, the adapter, the DP schema and targets, the ledger (the run loop's)
    evaluate    TSTR / TVD / fairness / DCR+MIA on real data (owner-side report, not a release)
    reference   the TSTR classifiers trained on the real sample (owner-side reference row)

One release per run directory: the AIM baseline is a run of its own (``dpsynth_core.tabular.
aim_run``). Before the run directory exists, the whole private file is checked against the public
schema and delta against its size, so a bad file or config leaves nothing behind. Every stage
that needs private rows reads them from their source itself (:mod:`.private_data`); a stage
function gets only the config and the run directory path. The stages live in ``stages_dp``,
``stages_model`` and ``stages_report``; everything around them is the run loop's (``run_loop``).
"""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.run_loop import run_method
from dpsynth_core.runs import StageMarkers
from dpsynth_core.runs.contract import Method, PrivacyPlan, Runner, Stage, local_runner
from dpsynth_core.tabular import private_data
from dpsynth_core.tabular.config import DpFairConfig
from dpsynth_core.tabular.run_schema import public_schema
from dpsynth_core.tabular.schema import TableSchema
from dpsynth_core.tabular.stages_dp import (plan_fair_stats, plan_marginals, plan_prepare, stage_fair_stats,
                                             stage_marginals, stage_prepare)
from dpsynth_core.tabular.stages_model import plan_model, stage_model
from dpsynth_core.tabular.stages_report import stage_evaluate, stage_reference

STAGES = ["prepare", "fair_stats", "marginals", "train", "generate", "release", "evaluate", "reference"]
EXECUTION_ONLY = ("use_ray", "resources", "training.torch_threads")  # how a run executes, not what it is

__all__ = ["STAGES", "DpFairMethod", "local_runner", "run_dpfair", "stages_to_run"]


def stages_to_run(cfg: DpFairConfig, schema: TableSchema) -> list[str]:
    """The run's stages by name (the pre-flight's plan): ``STAGES`` less those its config turns off."""
    skip = set()
    if not cfg.fairness.enabled:
        skip.add("fair_stats")
    if not cfg.needs_dp_marginals:
        skip.add("marginals")
    if not (cfg.evaluate_reference and schema.target is not None):
        skip.add("reference")
    return [s for s in STAGES if s not in skip]


class DpFairMethod(Method):
    """DPFairLLM: its stages for the run loop; ``train`` + ``generate`` are one stage (``model``, the Ray task)."""

    kind = "dpfairllm"
    config: DpFairConfig

    def stages(self) -> list[Stage]:
        light = {"reads_private": True, "in_driver": True}  # only the model stage is placed by the runner
        # each DP stage plans its events, reserved before the first stage runs (run_loop.reserve); the model
        # stage's fill-budget DP-SGD plans against what the measurements planned before it will leave
        every = [Stage("prepare", stage_prepare, records=("gaussian",), plan=plan_prepare, **light),
                 Stage("fair_stats", stage_fair_stats, records=("gaussian",), plan=plan_fair_stats, **light),
                 Stage("marginals", stage_marginals, records=("gaussian",), plan=plan_marginals, **light),
                 Stage("model", stage_model, records=("dpsgd", "post_processing"), reads_private=True,
                       marks=("train", "generate"), plan=plan_model),
                 Stage("evaluate", stage_evaluate, after_release=True, **light),
                 Stage("reference", stage_reference, after_release=True, **light)]
        wanted = set(stages_to_run(self.config, public_schema(self.config)))
        return [s for s in every if wanted & set(s.marks or (s.name,))]

    def run_dir(self) -> Path:
        return self.config.run_dir()

    def former_run_dir(self) -> Path:
        return self.config.former_run_dir()

    def privacy_plan(self) -> PrivacyPlan:
        return private_data.privacy_plan(self.config, public_schema(self.config))

    def release_items(self, root: Path) -> dict[str, Path]:
        items = {"synthetic.csv": root / "synthetic.csv", "schema_resolved.json": root / "schema_resolved.json",
                 "adapter": Path(StageMarkers(root).summary("train")["adapter_dir"])}
        for name in ("fair_targets.json", "public_stage.json"):  # public_stage.json: how to rebuild the adapter's base
            if (root / name).is_file():
                items[name] = root / name
        return items

    def identity(self) -> tuple[dict, tuple[str, ...]]:
        return self.config.model_dump(mode="json"), EXECUTION_ONLY


def run_dpfair(cfg: DpFairConfig, *, resume: bool = True, runner: Runner = local_runner) -> Path:
    """Run every DPFairLLM stage not yet finished; return the run directory. ``runner(stage_model, cfg,
    run_dir)`` runs each stage (in this process by default; ``ray_jobs.dpfair`` the model stage on Ray)."""
    return run_method(DpFairMethod(cfg), resume=resume, runner=runner).run_dir
