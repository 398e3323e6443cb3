"""ACTG-ARL end to end: its stages for the run loop (``run_loop``: lock, rerun rule, ledger, release).

    cfg = load_actg_config("configs/actg_demo.yaml")
    run_dir = run_pipeline(cfg, resume=True)             # in-process
    run_dir = run_pipeline(cfg, runner=ray_runner)        # each stage a Ray task (ray_jobs/actg.py)

Stages (``mode: actg``)::

    schema        copy the public schema                                     (no data)
    reward_model  supervised reward: fit on data.public_path's rows only -> reward_model/ (not private data)
    private       load the private records; extract attributes (in memory only);
                    features      AIM synthetic attribute table under eps1  -> features.csv
                    dp_generator  DP-SGD LoRA on (attribute prompt -> text) under eps2 -> generator/
    generate      the synthetic rows split into three disjoint pools (anchor / rl / eval, ``pools.py``);
                  N candidates per anchor row -> candidates.jsonl; one plain sample per eval row
                  (the ACTG row of the paper's table) -> plain_eval.jsonl; rl rows -> rl_prompts.csv
    best_of_n     reward-scored, best kept -> anchors.jsonl                  (post-processing)
    anchored_rl   RLOO (KL beta to the DP generator) + gamma(t) * SFT on anchors, rl rows only -> rl/adapter
    synthesize    one text per synthetic row from the RL policy -> synthetic.jsonl (each tagged with its pool)
    evaluate      on the eval pool only: IFAcc (judge) and IFAcc (reward), MAUVE, classifier, d_JS
                  (base e), length/diversity -> metrics.json, plots/  (``evaluation.py``)

``mode: vanilla`` (the ablation) runs ``private`` without attributes (DP-SGD on unconditional
prompts under the WHOLE epsilon), then ``synthesize`` and ``evaluate``.

Private attributes: the extracted attributes are a function of private records. They live only
in the memory of the ``private`` stage (one process / Ray task), which feeds them to AIM and to
the DP-SGD training examples and returns nothing but the DP outputs. They are never written to
disk; when a run resumes after ``features`` but before ``dp_generator`` completed, they are
re-extracted (extraction is deterministic and is not a release, so it costs no epsilon).

Resume: each stage writes ``stages/<name>.done`` (atomically) after its outputs are in place, and
a re-run skips completed stages. DP stages are charged once: a stage whose ledger entry exists
but whose marker does not (a crash between the two) is closed from its outputs if they are
complete, never re-charged silently. The DP-SGD engine itself resumes from its checkpoints.

The config is ``actg.config``; the stages ``actg.stages_private`` and ``actg.stages_post``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from dpsynth_core.actg.best_of_n import ServeBestOfN
from dpsynth_core.actg.config import STAGES_ACTG, ActgConfig, load_actg_config
from dpsynth_core.actg.run_files import RunDir
from dpsynth_core.actg.stages_post import (serve_app_needs_the_driver, stage_anchored_rl, stage_best_of_n,
                                           stage_generate, stage_reward_model, stage_synthesize)
from dpsynth_core.actg.stages_private import plan_private, stage_evaluate, stage_private, stage_schema
from dpsynth_core.errors import ConfigError
from dpsynth_core.run_loop import open_run_ledger, resolve_delta, run_method
from dpsynth_core.runs import open_run_dir
from dpsynth_core.runs.contract import Method, PrivacyPlan, Runner, Stage, StageInterrupted, local_runner

__all__ = ["STAGES_ACTG", "STAGE_FUNCTIONS", "ActgConfig", "ActgMethod", "RunDir", "StageInterrupted",
           "load_actg_config", "local_runner", "open_or_create_ledger", "prepare_run_dir", "run_pipeline"]

POST = ("post_processing",)
STAGE_DECLARATIONS = {  # name -> (function, privacy events it records, reads private data, isolated, after release)
    "schema": (stage_schema, (), False, False, False),
    "reward_model": (stage_reward_model, POST, False, False, False),  # zero-cost entry: the public labeled file
    # features (AIM, or the DP-FT feature LM) + dp_generator (DP-SGD); zero-cost entries in the ablations
    "private": (stage_private, ("zcdp", "dpsgd", "post_processing"), True, False, False),
    "generate": (stage_generate, POST, False, False, False),
    "best_of_n": (stage_best_of_n, POST, False, False, False),
    "anchored_rl": (stage_anchored_rl, POST, False, True, False),  # no private data directory reachable
    "synthesize": (stage_synthesize, POST, False, False, False),
    "evaluate": (stage_evaluate, (), True, False, True),  # owner-side, on held-out real rows
}
STAGE_FUNCTIONS = {name: decl[0] for name, decl in STAGE_DECLARATIONS.items()}
# the events a stage will record, reserved by the run loop before the first stage runs (``run_loop.reserve``)
STAGE_PLANS = {"private": plan_private}


class ActgMethod(Method):
    """ACTG-ARL (or an ablation): the config's stages; ``serve_best_of_n`` is how ``best_of_n`` reaches a
    Serve app (``best_of_n.serve_app``), passed in by the Ray driver."""

    kind = "actg"
    config: ActgConfig

    def __init__(self, config: ActgConfig, serve_best_of_n: ServeBestOfN | None = None) -> None:
        super().__init__(config)
        self.serve_best_of_n = serve_best_of_n

    def stages(self) -> list[Stage]:
        out = []
        for name in self.config.stages:
            fn, records, private, isolated, after = STAGE_DECLARATIONS[name]
            if name == "best_of_n" and self.serve_best_of_n is not None:  # keeps the stage's name for the runner
                fn = functools.update_wrapper(functools.partial(fn, serve_best_of_n=self.serve_best_of_n), fn)
            out.append(Stage(name, fn, records=records, reads_private=private, isolated=isolated, after_release=after,
                             plan=STAGE_PLANS.get(name)))
        return out

    def run_dir(self) -> Path:
        return self.config.resolved_run_dir()

    def privacy_plan(self) -> PrivacyPlan:
        """m = data.n_records (public); delta checked against it. The whole file: ``actg.preflight``."""
        cfg = self.config
        if cfg.best_of_n.serve_app and self.serve_best_of_n is None and "best_of_n" in cfg.stages:
            raise ConfigError(serve_app_needs_the_driver(cfg.best_of_n.serve_app))
        plan = PrivacyPlan(cfg.name, cfg.privacy.epsilon, cfg.privacy.delta, cfg.data.n_records)
        resolve_delta(plan)
        return plan

    def release_items(self, root: Path) -> dict[str, Path]:
        """The synthetic texts, the DP features and adapters, the schema -- not the metrics, plots,
        candidates or anchors (owner-side or intermediate)."""
        cfg, rd = self.config, RunDir(root)
        items = {"synthetic.jsonl": rd.synthetic}
        if cfg.generator_mode == "dp_ft":
            items["generator_adapter"] = rd.generator / "adapter"
        if cfg.mode == "actg":
            items.update({"features.csv": rd.features, "schema.yaml": rd.schema})
            if cfg.generator_mode == "dp_ft":
                items["rl_adapter"] = rd.rl / "adapter"
        return items

    def release_name(self) -> str:
        return f"actg ({self.config.mode})"

    def identity(self) -> tuple[dict, tuple[str, ...]]:
        # how a run executes, not what it is: a test knob, and the CPU threads of its stages
        return self.config.model_dump(mode="json"), ("stop_after_stage", "torch_threads")

    def stop_after(self) -> str | None:
        return self.config.stop_after_stage


def prepare_run_dir(cfg: ActgConfig, resume: bool) -> Path:
    """The run directory under the rerun rule (``runs.open_run_dir``), as the run loop opens it."""
    method = ActgMethod(cfg)
    snapshot, ignore = method.identity()
    return open_run_dir(method.run_dir(), snapshot, resume=resume, ignore=ignore)


def open_or_create_ledger(cfg: ActgConfig, root: Path):
    """The run's ledger, as the run loop opens it (``run_loop.ledger``)."""
    method = ActgMethod(cfg)
    return open_run_ledger(Path(root), method.privacy_plan(), method.kind)


def run_pipeline(cfg: ActgConfig, *, resume: bool = True, runner: Runner = local_runner,
                 serve_best_of_n: ServeBestOfN | None = None) -> Path:
    """Run every stage not yet completed (each through ``runner``); return the run directory."""
    return run_method(ActgMethod(cfg, serve_best_of_n), resume=resume, runner=runner).run_dir
