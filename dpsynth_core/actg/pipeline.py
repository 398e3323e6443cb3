"""ACTG-ARL end to end: stages, run directory, completion markers, resume.

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
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from dpsynth_core.actg.anchored_rl import AnchoredRLConfig
from dpsynth_core.actg.best_of_n import ServeBestOfN
from dpsynth_core.actg.data_split import DataSettings, load_private_split
from dpsynth_core.actg.extractors import ExtractorConfig
from dpsynth_core.actg.generator import GenerationSettings
from dpsynth_core.actg.run_files import RunDir, load_run_schema, set_torch_threads
from dpsynth_core.actg.stages_post import (serve_app_needs_the_driver, stage_anchored_rl, stage_best_of_n,
                                           stage_generate, stage_reward_model, stage_synthesize)
from dpsynth_core.config import OUTPUT_ROWS_CAP, THREADS_CAP, StrictConfig, cap, load_config
from dpsynth_core.config.resources import PipelineResources
from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.randomness import refuse_test_only_knobs
from dpsynth_core.runs import announce_finished, open_run_dir
from dpsynth_core.runs.lock import locked_run
from dpsynth_core.runs.release import release_dir
from dpsynth_core.runs.storage import RunDirPath

STAGES_ACTG = ["schema", "reward_model", "private", "generate", "best_of_n", "anchored_rl", "synthesize", "evaluate"]
STAGES_VANILLA = ["private", "synthesize", "evaluate"]
STAGES_DIRECT_PROMPT = ["schema", "reward_model", "private", "synthesize", "evaluate"]
REPO_ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
# config
# ---------------------------------------------------------------------------------------------
class PrivacySettings(StrictConfig):
    """Total budget and its split. ``features_share`` of epsilon goes to AIM (eps1), the rest to
    the DP generator (eps2); the vanilla ablation gives the whole epsilon to its generator."""

    epsilon: float = Field(4.0, gt=0)  # .inf: a non-private reference run, only with not_private: true
    delta: float | None = Field(None, gt=0, lt=1)   # default min(1e-5, m^-1.1), m = data.n_records
    features_share: float = Field(0.5, gt=0, lt=1)


class FeatureSettings(StrictConfig):
    """AIM synthetic attribute table (``dpsynth_core.actg.features``)."""

    n_synthetic: Annotated[int, OUTPUT_ROWS_CAP] = Field(50, ge=1)   # synthetic attribute rows = texts generated
    options: dict[str, Any] = Field(default_factory=dict)  # extra keyword arguments for features.py
    # disjoint pools of the synthetic rows: Best-of-N anchors, RL prompts, the rest for evaluation
    anchor_share: float = Field(1 / 3, gt=0, lt=1)
    rl_share: float = Field(1 / 3, gt=0, lt=1)
    # aim: AIM on the attribute table; dp_ft: the ablation "AIM -> DP-FT feature generator", an LM
    # DP-fine-tuned (eps1) on the attribute rows as text, sampled option by option (``feature_lm.py``)
    generator: Literal["aim", "dp_ft"] = "aim"
    lm: dict[str, Any] = Field(default_factory=dict)  # dp_ft: overrides of `generator` (DpSgdConfig fields)


class BestOfNSettings(StrictConfig):
    n: Annotated[int, cap(64, 'candidates generated and scored per text (n x features.n_synthetic generations)')] = Field(5, ge=1)
    serve_app: str | None = None  # name of a running Serve app with a BestOfN deployment; None = in-process


class EvaluationSettings(StrictConfig):
    label_field: str = "primary_research_area"  # downstream classifier target (oracle column on bioRxiv)
    mauve: bool = True
    classifier: bool = True
    embedder: str = "minilm"
    # IFAcc judge, not the reward: TF-IDF classifier on the held-out labeled real rows (owner-side)
    judge: Literal["tfidf", "none"] = "tfidf"


class ActgConfig(StrictConfig):
    """One ACTG-ARL run (or the vanilla ablation with ``mode: vanilla``)."""

    name: str = "actg"
    mode: Literal["actg", "vanilla"] = "actg"
    # dp_ft: the DP conditional generator (eps2); direct_prompt: the ablation that prompts the base
    # model with the attributes instead (no training, no eps2 spent, no Best-of-N / RL)
    generator_mode: Literal["dp_ft", "direct_prompt"] = "dp_ft"
    not_private: bool = False  # required for privacy.epsilon = .inf (reference_runs.py); outputs marked
    # default runs/<name>; a path or file:// URI (shared storage on a cluster); key `output_dir` (was `run_dir`)
    run_dir: RunDirPath | None = Field(None, alias="output_dir")
    data: DataSettings = Field(default_factory=DataSettings)
    schema_path: Path = Path("configs/schemas/biorxiv.yaml")
    privacy: PrivacySettings = Field(default_factory=PrivacySettings)
    extractor: ExtractorConfig = Field(default_factory=ExtractorConfig)  # private attributes (stage private)
    reward: ExtractorConfig | None = None   # Best-of-N and RL reward; None = the extractor (a text extractor)
    features: FeatureSettings = Field(default_factory=FeatureSettings)
    generator: dict[str, Any] = Field(default_factory=lambda: {"steps": 30})  # DpSgdConfig minus epsilon/delta
    prompt_template: str | None = None    # default: conditional (actg) / unconditional (vanilla)
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    best_of_n: BestOfNSettings = Field(default_factory=BestOfNSettings)
    rl: AnchoredRLConfig = Field(default_factory=AnchoredRLConfig)
    evaluation: EvaluationSettings = Field(default_factory=EvaluationSettings)
    torch_threads: Annotated[int, THREADS_CAP] = Field(2, ge=1)
    # scheduling only (not part of the run's identity: a resumed run may get another cluster)
    resources: PipelineResources = Field(default_factory=PipelineResources, exclude=True)
    stop_after_stage: str | None = None   # testing: stop (as if killed) once this stage completed

    @field_validator("generator")
    @classmethod
    def _generator_fields(cls, value: dict) -> dict:
        from dpsynth_core.dpsgd import DpSgdConfig

        for key in ("epsilon", "delta"):
            if key in value:
                raise ValueError(f"'{key}' comes from the 'privacy' section, not from 'generator'")
        DpSgdConfig.model_validate({**value, "epsilon": 1.0})  # same field errors as DpSgdConfig
        refuse_test_only_knobs("generator", value)
        return value

    @field_validator("features")
    @classmethod
    def _feature_lm_fields(cls, value: FeatureSettings) -> FeatureSettings:
        if value.generator == "dp_ft":
            for key in ("epsilon", "delta"):
                if key in value.lm:
                    raise ValueError(f"features.lm: '{key}' comes from the 'privacy' section")
        refuse_test_only_knobs("features.lm", value.lm)
        return value

    @model_validator(mode="after")
    def _reference_run(self) -> ActgConfig:
        from dpsynth_core.privacy.reference_runs import check_reference_config

        try:
            check_reference_config(self.privacy.epsilon, self.not_private, "privacy.epsilon")
        except ConfigError as exc:  # a validation error like every other field's
            raise ValueError(str(exc)) from None
        if self.generator_mode == "direct_prompt" and self.mode != "actg":
            raise ValueError("generator_mode: direct_prompt is an ablation of mode: actg")
        if self.features.generator == "dp_ft":
            self.feature_lm_config(1.0)  # same field errors as DpSgdConfig, before any data is read
        return self

    @model_validator(mode="after")
    def _reward_scores_text(self) -> ActgConfig:
        reward = self.reward or self.extractor
        if self.mode == "actg" and reward.kind == "columns":
            raise ValueError("reward: 'columns' cannot score a synthetic text; set a text extractor "
                             "(e.g. {kind: supervised} with data.public_path)")
        if self.mode == "actg" and reward.kind == "supervised" and self.data.public_path is None:
            raise ValueError("reward kind 'supervised' is trained on public labeled rows: set data.public_path "
                             "(a file declared public, disjoint from data.path)")
        if self.mode == "actg" and self.features.n_synthetic < 3:
            raise ValueError("features.n_synthetic: ACTG needs >= 3 rows (disjoint anchor / rl / eval pools)")
        if self.features.anchor_share + self.features.rl_share >= 1:
            raise ValueError("features.anchor_share + features.rl_share must leave rows for evaluation (< 1)")
        return self

    def reward_config(self, root: Path | str) -> ExtractorConfig:
        """The reward extractor; a supervised one is read from the run's reward_model/ directory."""
        reward = self.reward or self.extractor
        if reward.kind == "supervised":
            return reward.model_copy(update={"model_dir": str(RunDir(Path(root)).reward_model)})
        return reward

    @model_validator(mode="after")
    def _stop_stage(self) -> ActgConfig:
        if self.stop_after_stage is not None and self.stop_after_stage not in self.stages:
            raise ValueError(f"stop_after_stage must be one of {self.stages}")
        return self

    @property
    def stages(self) -> list[str]:
        if self.mode == "vanilla":
            return STAGES_VANILLA
        return STAGES_DIRECT_PROMPT if self.generator_mode == "direct_prompt" else STAGES_ACTG

    @property
    def is_reference(self) -> bool:
        """epsilon = inf with not_private: true: no noise, no clipping; the ledger is marked."""
        from dpsynth_core.privacy.reference_runs import is_infinite

        return is_infinite(self.privacy.epsilon)

    @property
    def epsilon_features(self) -> float:
        if self.mode != "actg":
            return 0.0
        return math.inf if self.is_reference else self.privacy.epsilon * self.privacy.features_share

    @property
    def epsilon_generator(self) -> float:
        if self.mode == "actg" and self.generator_mode == "direct_prompt":
            return 0.0  # the base model is prompted: no training on private data
        return math.inf if self.is_reference else self.privacy.epsilon - self.epsilon_features

    @property
    def main_system(self) -> str:
        """The system whose texts are released: evaluation's headline row."""
        if self.mode == "vanilla":
            return "vanilla"
        return "direct_prompt" if self.generator_mode == "direct_prompt" else "actg_arl"

    def resolved_run_dir(self) -> Path:
        return Path(self.run_dir) if self.run_dir is not None else Path("runs") / self.name

    def resolved(self, path: Path) -> Path:
        """Relative paths are taken from the current directory, else from the repository root."""
        path = Path(path)
        return path if path.is_absolute() or path.exists() else REPO_ROOT / path

    def template_text(self) -> str:
        from dpsynth_core.actg.generator import load_prompt_template

        return load_prompt_template(self.prompt_template or ("conditional" if self.mode == "actg" else "unconditional"))

    def dpsgd_config(self, epsilon: float):
        from dpsynth_core.dpsgd import DpSgdConfig

        return DpSgdConfig.model_validate({"torch_threads": self.torch_threads, **self.generator, "epsilon": epsilon})

    def feature_lm_config(self, epsilon: float):
        """The DP-FT feature generator's DpSgdConfig: ``generator`` overridden by ``features.lm``;
        never ``fill_budget`` (the conditional generator, trained after it, is the last DP stage)."""
        from dpsynth_core.dpsgd import DpSgdConfig

        return DpSgdConfig.model_validate({"torch_threads": self.torch_threads, **self.generator, **self.features.lm,
                                           "fill_budget": False, "epsilon": epsilon})


def load_actg_config(path: str | Path) -> ActgConfig:
    return load_config(path, ActgConfig)


# ---------------------------------------------------------------------------------------------
# run directory
# ---------------------------------------------------------------------------------------------
class StageInterrupted(RuntimeError):
    """Raised after ``stop_after_stage`` (tests simulate a crash with it)."""


# ---------------------------------------------------------------------------------------------
# orchestration
# ---------------------------------------------------------------------------------------------
Runner = Callable[..., dict]


def local_runner(fn: Callable[..., dict], *args, isolated: bool = False) -> dict:
    """Run a stage in this process (tests, no Ray)."""
    return fn(*args)


def prepare_run_dir(cfg: ActgConfig, resume: bool) -> Path:
    """Create, reopen or (``resume=False``) replace the run directory: the rerun rule of ``runs/run_dir.py``
    (``stop_after_stage`` is a test knob, not part of the run's identity)."""
    return open_run_dir(cfg.resolved_run_dir(), cfg.model_dump(mode="json"), resume=resume,
                        ignore=("stop_after_stage",))


def open_or_create_ledger(cfg: ActgConfig, root: Path):
    """delta: min(1e-5, m^-1.1) for the configured (public) m = data.n_records by default; an explicit
    privacy.delta must be below 1/m (never computed from the drawn set's size, which is private)."""
    from dpsynth_core.privacy import PrivacyLedger, check_delta_for_size, default_delta

    from dpsynth_core.actg.reference import REFERENCE_LEDGER_BUDGET
    from dpsynth_core.privacy.reference_runs import mark_reference_run

    if (root / "ledger.sqlite").is_file():
        return PrivacyLedger.open(root)
    m = cfg.data.n_records
    delta = check_delta_for_size(cfg.privacy.delta, m, "privacy.delta") if cfg.privacy.delta else default_delta(m)
    budget = REFERENCE_LEDGER_BUDGET if cfg.is_reference else cfg.privacy.epsilon
    ledger = PrivacyLedger.create(root, dataset=cfg.name, epsilon_budget=budget, delta=delta, public_size=m)
    mark_reference_run(ledger, "actg.reference", cfg.privacy.epsilon)  # before any stage reads private data
    return ledger


@locked_run(lambda cfg, **_: cfg.resolved_run_dir())  # one process per run (runs/lock.py)
def run_pipeline(cfg: ActgConfig, *, resume: bool = True, runner: Runner = local_runner,
                 serve_best_of_n: ServeBestOfN | None = None) -> Path:
    """Run every stage not yet completed; return the run directory. ``serve_best_of_n``: how the
    ``best_of_n`` stage reaches a Serve app (``best_of_n.serve_app``); the Ray driver passes it in."""
    if cfg.best_of_n.serve_app and serve_best_of_n is None and "best_of_n" in cfg.stages:
        raise ConfigError(serve_app_needs_the_driver(cfg.best_of_n.serve_app))
    root = prepare_run_dir(cfg, resume)
    if all(RunDir(root).done(s) for s in cfg.stages) and release_dir(root).is_dir():
        announce_finished(root)
        return root
    open_or_create_ledger(cfg, root)
    for name in cfg.stages:
        rd = RunDir(root)
        if rd.done(name):
            continue
        if name == "evaluate":  # the release needs no evaluation; a DP sweep's trial is ranked with it in place
            _write_release(cfg, rd)
        t0 = time.perf_counter()
        fn = STAGE_FUNCTIONS[name]
        if name == "best_of_n" and serve_best_of_n is not None:  # keeps the stage's name for the runner
            fn = functools.update_wrapper(functools.partial(fn, serve_best_of_n=serve_best_of_n), fn)
        summary = runner(fn, cfg, str(root), isolated=(name == "anchored_rl"))
        RunDir(root).mark(name, {"seconds": round(time.perf_counter() - t0, 2), **(summary or {})})
        if cfg.stop_after_stage == name:
            raise StageInterrupted(f"stopped after stage '{name}' (stop_after_stage)")
    if not release_dir(root).is_dir():
        _write_release(cfg, RunDir(root))
    return root


def _write_release(cfg: ActgConfig, rd: RunDir) -> None:
    """release/: the synthetic texts, the DP features and adapters, the schema and the ledger --
    not the metrics, plots, candidates or anchors (owner-side or intermediate)."""
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.runs.release import write_release

    items = {"synthetic.jsonl": rd.synthetic}
    if cfg.generator_mode == "dp_ft":
        items["generator_adapter"] = rd.generator / "adapter"
    if cfg.mode == "actg":
        items.update({"features.csv": rd.features, "schema.yaml": rd.schema})
        if cfg.generator_mode == "dp_ft":
            items["rl_adapter"] = rd.rl / "adapter"
    write_release(rd.root, items, ledger=PrivacyLedger.open(rd.root), method=f"actg ({cfg.mode})")


# ---------------------------------------------------------------------------------------------
# stages: each takes (config, run_dir) and returns a small JSON summary (never a private value)
# ---------------------------------------------------------------------------------------------
def stage_schema(cfg: ActgConfig, root: str) -> dict:
    """Copy the public schema into the run directory (no data involved)."""
    from dpsynth_core.actg.schema import load_schema

    schema = load_schema(cfg.resolved(cfg.schema_path))
    schema.save(RunDir(Path(root)).schema)
    return {"fields": schema.num_fields, "options": sum(len(f.options) for f in schema.fields)}


def stage_private(cfg: ActgConfig, root: str) -> dict:
    """The only stage that reads private records: attribute extraction (memory only), AIM under
    eps1, DP-SGD under eps2. Returns DP outputs' summaries only."""
    from dpsynth_core.privacy import PrivacyLedger

    set_torch_threads(cfg)
    rd = RunDir(Path(root))
    ledger = PrivacyLedger.open(rd.root)
    train, _, public_size = load_private_split(cfg)
    texts = [str(t)[: cfg.data.max_chars] for t in train[cfg.data.text_col]]
    schema = load_run_schema(cfg, rd.root) if cfg.mode == "actg" else None
    attrs = None
    if cfg.mode == "actg" and not (rd.done("features") and (rd.done("dp_generator") or
                                                          cfg.generator_mode == "direct_prompt")):
        from dpsynth_core.actg.extractors import build_extractor

        if cfg.extractor.kind == "columns":  # the records' own labels (bioRxiv: the oracle's)
            from dpsynth_core.actg.supervised import columns_attributes

            attrs = columns_attributes(train, schema)  # private: stays in memory
        else:
            attrs = build_extractor(cfg.reward_config(rd.root) if cfg.extractor.kind == "supervised" else cfg.extractor,
                                    schema).extract(texts)  # private: stays in memory
    if cfg.mode == "actg" and not rd.done("features"):
        rd.mark("features", _run_features(cfg, rd, schema, attrs, ledger, public_size))
    if not rd.done("dp_generator"):
        rd.mark("dp_generator", _run_dp_generator(cfg, rd, schema, texts, attrs, ledger, public_size))
    del attrs, texts, train
    return {"features": rd.summary("features"), "dp_generator": rd.summary("dp_generator")}


def _ledger_has(ledger, stage: str) -> bool:
    return any(e.stage == stage for e in ledger.entries())


def _run_features(cfg: ActgConfig, rd: RunDir, schema, attrs: list[dict], ledger, public_size: int) -> dict:
    """AIM (or the DP-FT feature LM) under eps1 -> features.csv (+ d_JS of 1- and 2-way marginals
    vs the real attributes); an epsilon = inf run without noise (``reference.py``)."""
    import pandas as pd

    from dpsynth_core.actg import features

    if (_ledger_has(ledger, "features") or cfg.is_reference) and rd.features.is_file():
        return {"closed_from_outputs": True}  # charged, written, marker lost: never re-charge
    real = pd.DataFrame(attrs, columns=schema.field_names)
    extra = {"generator": cfg.features.generator}
    if cfg.features.generator == "dp_ft":
        from dpsynth_core.actg.feature_lm import synthesize_features_lm

        synth, lm_summary = synthesize_features_lm(real, schema, cfg, rd, ledger, public_size)
        extra.update(lm_summary)
    elif cfg.is_reference:
        from dpsynth_core.actg.reference import noiseless_features

        synth, resampled = noiseless_features(real, schema, cfg.features.n_synthetic, cfg.data.seed, ledger,
                                              rd.features)
        extra.update(resampled)
    else:
        synth = features.synthesize_features(real, schema, epsilon=cfg.epsilon_features,
                                             n_rows=cfg.features.n_synthetic, ledger=ledger, stage="features",
                                             seed=cfg.data.seed, out_path=rd.features, **cfg.features.options)
    # Evaluation statistic against the real (extracted) attributes, reported like the paper's d_JS^f.
    cats = schema.categories()
    d1 = features.marginal_djs(real, synth, order=1, categories=cats)
    d2 = features.marginal_djs(real, synth, order=2, categories=cats)
    return {"epsilon": cfg.epsilon_features, "rows": len(synth), "djs_1way_mean": d1["mean"],
            "djs_1way_max": d1["max"], "djs_2way_mean": d2["mean"], "djs_2way_max": d2["max"],
            "djs_1way": d1["per_marginal"], **extra}


def _run_dp_generator(cfg: ActgConfig, rd: RunDir, schema, texts: list[str], attrs, ledger, public_size: int) -> dict:
    from dpsynth_core.actg.generator import build_train_examples, train_conditional_generator

    if cfg.generator_mode == "direct_prompt":
        from dpsynth_core.actg.reference import record_direct_prompting

        return record_direct_prompting(cfg, ledger)
    adapter = rd.generator / "adapter"
    if (_ledger_has(ledger, "dp_generator") or cfg.is_reference) and (adapter / "adapter_config.json").is_file():
        return {"adapter_dir": str(adapter), "closed_from_outputs": True}
    examples = build_train_examples(texts, attrs, schema, cfg.template_text(),
                                    text_description=cfg.data.text_description)
    # q and delta from the public expected size: the drawn set's size must not reach the ledger
    dp = cfg.dpsgd_config(cfg.epsilon_generator).model_copy(update={"public_num_units": public_size})
    if cfg.is_reference:
        from dpsynth_core.actg.reference import train_noiseless_lora

        result = train_noiseless_lora(examples, dp, output_dir=rd.generator, ledger=ledger, stage="dp_generator")
    else:
        result = train_conditional_generator(examples, dp, output_dir=rd.generator, ledger=ledger,
                                             stage="dp_generator")
    losses = [h["loss"] for h in result.history if h.get("loss") is not None]
    return {"adapter_dir": str(result.adapter_dir), "epsilon": result.epsilon, "steps": result.steps,
            "noise_multiplier": result.noise_multiplier, "sampling_rate": result.sampling_rate,
            "clipping_norm": None if cfg.is_reference else dp.max_grad_norm,
            "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None}


def stage_evaluate(cfg: ActgConfig, root: str) -> dict:
    """metrics.json + plots/ (``actg.evaluation``): owner-side, outside the DP guarantee."""
    from dpsynth_core.actg.evaluation import evaluate_run

    return evaluate_run(cfg, root)


STAGE_FUNCTIONS: dict[str, Callable[[ActgConfig, str], dict]] = {
    "schema": stage_schema, "reward_model": stage_reward_model, "private": stage_private, "generate": stage_generate,
    "best_of_n": stage_best_of_n, "anchored_rl": stage_anchored_rl, "synthesize": stage_synthesize,
    "evaluate": stage_evaluate,
}
