"""ACTG-ARL's typed config (``mode: actg``, or the ``vanilla`` ablation): budget and split, data,
extractor and reward, features, generator, Best-of-N, RL, evaluation, resources."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from dpsynth_core.actg.anchored_rl import AnchoredRLConfig
from dpsynth_core.actg.data_split import DataSettings
from dpsynth_core.actg.extractors import ExtractorConfig
from dpsynth_core.actg.generator import GenerationSettings
from dpsynth_core.actg.run_files import RunDir
from dpsynth_core.config import OUTPUT_ROWS_CAP, THREADS_CAP, StrictConfig, cap, load_config
from dpsynth_core.config.placement import PlacementSettings
from dpsynth_core.config.resources import PipelineResources
from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.randomness import refuse_test_only_knobs
from dpsynth_core.runs.storage import RunDirPath

STAGES_ACTG = ["schema", "reward_model", "private", "generate", "best_of_n", "anchored_rl", "synthesize", "evaluate"]
STAGES_VANILLA = ["private", "synthesize", "evaluate"]
STAGES_DIRECT_PROMPT = ["schema", "reward_model", "private", "synthesize", "evaluate"]
REPO_ROOT = Path(__file__).resolve().parents[2]


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
    torch_threads: Annotated[int | None, THREADS_CAP] = Field(None, ge=1)  # None: the CPUs the stage was given
    # every stage's device and dtype where its own section leaves them auto (extractor, reward, generator and
    # so features.lm, generation, rl); a section's own device/dtype overrides it (None: unset, so a run made before this key
    # existed is the same run: runs/run_dir.changed_keys)
    placement: PlacementSettings | None = None
    # scheduling only (not part of the run's identity: a resumed run may get another cluster)
    resources: PipelineResources = Field(default_factory=PipelineResources, exclude=True)
    stop_after_stage: str | None = None   # testing: stop (as if killed) once this stage completed
    _zero_shot_by_default: bool = PrivateAttr(False)

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
    def _resolve_auto_extractor(self) -> ActgConfig:
        """``extractor.kind: auto``: the supervised extractor when a declared-public labeled file exists (it beat
        the zero-shot reader on a held-out half of bioRxiv: docs/results/extractor_choice.md), else the zero-shot
        embedding extractor, which the pre-flight names in one line."""
        for name in ("extractor", "reward"):
            section = getattr(self, name)
            if section is not None and section.kind == "auto":
                kind = "supervised" if self.data.public_path is not None else "embedding"
                setattr(self, name, section.model_copy(update={"kind": kind}))
                self._zero_shot_by_default |= name == "extractor" and kind == "embedding"
        return self

    def extractor_note(self) -> str | None:
        """One line for the pre-flight when ``auto`` fell back to the zero-shot extractor."""
        if not self._zero_shot_by_default or self.mode != "actg":
            return None
        return ("note: attributes come from the zero-shot embedding extractor (no data.public_path). A few hundred "
                "labeled texts that you may publish, as data.public_path, train a much closer one "
                "(docs/guides/actg.md); set extractor: {kind: embedding} to keep this one without the note")

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
    def _stages_take_the_placement(self) -> ActgConfig:
        if self.placement is None:
            return self
        for name in ("extractor", "reward", "generation", "rl"):
            section = getattr(self, name)
            if section is not None:
                own = {"device": section.device, "dtype": section.dtype}
                setattr(self, name, section.model_copy(update=self.placement.under(own)))
        self.generator = self.placement.under(self.generator)
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

