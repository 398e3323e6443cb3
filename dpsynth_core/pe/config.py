"""Typed configs for WASP / Aug-PE runs (YAML via :func:`dpsynth_core.config.load_config`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from dpsynth_core.config.record_level import RecordLevelData
from dpsynth_core.config.placement import Dtype, PlacementSettings
from dpsynth_core.config import (
    BATCH_CAP, DELTA_CHECK, NEW_TOKENS_CAP, OUTPUT_ROWS_CAP, RECORDS_CAP, TEXT_CHARS_CAP, THREADS_CAP, StrictConfig, cap,
)
from dpsynth_core.config.resources import StageResources
from dpsynth_core.privacy.reference_runs import ReferenceRunConfig
from dpsynth_core.runs.storage import RunDirPath


class PLMConfig(StrictConfig):
    """One pretrained LM. ``backend``: ``hf`` (in-process), ``ray_actor`` (one Ray actor per PLM),
    ``serve`` (a Ray Serve Generator deployment), ``openai`` (an OpenAI-compatible endpoint)."""

    model: str = "smollm2-135m-instruct"
    name: str | None = None
    backend: Literal["hf", "ray_actor", "serve", "openai"] = "ray_actor"
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(0.95, gt=0, le=1)
    seed: int = 0
    batch_size: Annotated[int, BATCH_CAP] = Field(16, ge=1)
    num_threads: Annotated[int, THREADS_CAP] = Field(1, ge=1)  # torch threads per PLM worker
    resources: StageResources | None = None  # Ray actor / replica request; default: num_threads CPUs, no GPU
    base_url: str | None = None  # openai backend
    api_key_env: str = "OPENAI_API_KEY"
    max_concurrent_requests: int = Field(8, ge=1, le=256)  # openai backend: requests in flight at once
    max_retries: int = Field(3, ge=0, le=20)  # openai backend: per request, on 429 / 5xx / connection errors
    # hf / ray_actor / serve: the generation engine (auto: vLLM where installed and it runs the model, else HF)
    engine: Literal["auto", "vllm", "hf"] = "auto"
    # hf / ray_actor / serve: where the PLM runs (dpsynth_core.config.placement); a Ray PLM with device cuda asks Ray for a GPU
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Dtype = "auto"  # auto: bfloat16 on a GPU, float32 on CPU

    @model_validator(mode="after")
    def _gpu_plm_asks_for_one(self) -> PLMConfig:
        if (self.device == "cuda" and self.backend in ("ray_actor", "serve") and self.resources is not None
                and self.resources.gpus == 0):
            raise ValueError("device 'cuda' with resources.gpus 0: Ray hides GPUs from an actor that asks for none")
        return self

    @property
    def display_name(self) -> str:
        return self.name or self.model


class PEDataConfig(RecordLevelData):
    """The private labelled set and a disjoint real held-out test set."""

    source: Literal["biorxiv", "file"] = "biorxiv"
    path: Path | None = None  # for source: file (CSV / JSONL / Parquet)
    text_col: str = "abstract"
    label_col: str = "category"
    # Required and public: choosing classes from label counts would read the private data.
    classes: list[str] | None = None
    # M: the public expected size of the private working set (delta and what the ledger states)
    # key `n_records` (was `num_private`): every method names the working-set size so (config/keys.py)
    num_private: Annotated[int, RECORDS_CAP] = Field(100, ge=2, alias="n_records")
    # public share of the pool's rows drawn into the working set (secret Bernoulli draws); needed when
    # a file has more rows than num_private (a rate num_private / rows would depend on the file's size)
    sample_fraction: float | None = Field(None, gt=0, le=1)
    num_test: Annotated[int, cap(100_000, 'held-out texts embedded for evaluation')] = Field(250, ge=0)  # real held-out (owner-side evaluation), disjoint from the private pool
    max_chars: Annotated[int, TEXT_CHARS_CAP] = Field(1500, ge=50)
    seed: int = 0  # the held-out split only (public, content-keyed); the private set is drawn secretly
    # Federated: each party's records in its own file (same columns); the held-out set and the private draw
    # come from their union and every record keeps its party. Sets federated_parties to len(party_paths).
    party_paths: list[Path] | None = None

    @model_validator(mode="after")
    def _check_classes(self) -> PEDataConfig:
        if not self.classes or len(self.classes) < 2:
            raise ValueError(
                "data.classes is required: list at least 2 label names (public information). Classes are "
                "never chosen from the data's label counts, which would depend on the private records"
            )
        if len(set(self.classes)) != len(self.classes):
            raise ValueError("data.classes: label names must be unique")
        return self


class PEPrivacy(StrictConfig):
    epsilon: float = Field(4.0, gt=0)  # .inf: a non-private reference run, only with not_private: true
    # None: the shared rule min(1e-5, M^-1.1) (the paper's 1e-5 for M up to 35,000; docs/privacy.md).
    # "1/(M ln M)" is the small-M rule (2.2e-3 at M = 100: a weaker guarantee).
    delta: Annotated[float | Literal["1/(M ln M)"] | None, DELTA_CHECK] = None


class PEConfig(ReferenceRunConfig):
    """WASP (``method: wasp``) or Aug-PE (``method: augpe``); the budget under ``privacy:``, epsilon = inf
    with ``not_private: true``: no vote noise (``ReferenceRunConfig``)."""

    method: Literal["wasp", "augpe"]
    # a path or file:// URI (shared storage on a cluster); key `output_dir` (was `run_dir`: config/keys.py)
    run_dir: RunDirPath = Field(Path("runs/pe"), alias="output_dir")
    dataset_name: str = "biorxiv"
    prompts: str = "biorxiv"  # bundled prompt folder name or a directory
    data: PEDataConfig
    plms: list[PLMConfig] = Field(default_factory=lambda: [PLMConfig()], min_length=1, max_length=32)
    # every PLM's device and dtype where its own are auto, and what every Ray PLM (backend ray_actor / serve)
    # asks for where its own `resources` leaves a field unset
    # (None: unset, so a run made before these keys existed is the same run: runs/run_dir.changed_keys)
    placement: PlacementSettings | None = None
    resources: StageResources | None = None
    embedder: str = "minilm"
    privacy: PEPrivacy = Field(default_factory=PEPrivacy)
    iterations: Annotated[int, cap(1000, 'noisy votes, each a full round of generation')] = Field(2, ge=1)  # T noisy votes
    num_synthetic: Annotated[int, OUTPUT_ROWS_CAP] = Field(50, ge=2)  # size of the final synthetic set
    q: Annotated[int, cap(1024, 'Top-Q votes per private record')] = Field(8, ge=1)  # WASP Top-Q
    # Refused unless true: a first vote where a class has < 2Q candidates (nearest and farthest sets overlap).
    allow_degenerate_votes: bool = False
    select_per_class: Annotated[int, cap(256, 'examples per class in each prompt')] = Field(3, ge=1)  # WASP: S good and S bad examples per class
    example_fraction: float = Field(0.5, gt=0, le=1)  # WASP: share of the S good / S bad drawn per prompt
    contrastive: bool = True  # False (ablation): prompts show the good examples only; the vote is unchanged
    # WASP PLM weights: the paper's w_k = sum_{i in D_k} s_i / (|D_k| / |D|) ("share_normalised"), the
    # pre-paper sum of clipped votes ("raw_votes", rewards volume), or fixed equal weights ("uniform", ablation).
    plm_weighting: Literal["share_normalised", "raw_votes", "uniform"] = "share_normalised"
    threshold: float = 0.0  # Aug-PE: votes below this do not count (in vote units)
    weight_momentum: float = Field(0.0, ge=0, lt=1)  # extension (not in the paper): off by default
    weight_floor: float = Field(0.0, ge=0, lt=1)  # extension (not in the paper): off by default
    max_new_tokens: Annotated[int, NEW_TOKENS_CAP] = Field(96, ge=1)
    federated_parties: Annotated[int, cap(10_000, 'parties adding a noise share each')] = Field(1, ge=1)  # L > 1: each party adds N(0, (sigma/sqrt(L))^2)
    # One file split across the parties: non-IID Dirichlet(alpha) per class (the paper), or round_robin (i.i.d.)
    federated_split: Literal["dirichlet", "round_robin"] = "dirichlet"
    dirichlet_alpha: float = Field(1.0, gt=0)
    seed: int = 0  # generation seeds (post-processing); never DP noise or the private selection
    # Test-only: None draws the DP noise from OS entropy. An int is refused unless DPSYNTH_TEST_MODE=1,
    # and the run's ledger is then marked "not private" (the seed is public in config.yaml).
    noise_seed: int | None = None
    evaluate: bool = True
    baselines: bool = False  # also evaluate "private samples only" (non-DP reference) and zero-shot generation
    parallel_plms: bool = True  # False: call the PLMs one after another (timing comparison only)
    mauve: bool = True

    def _plm_defaults(self, plm: dict) -> dict:
        """A PLM's settings, where it leaves them unset, from the run's ``placement`` and ``resources``."""
        if self.placement is not None:
            plm = self.placement.under(plm)
        if self.resources is not None:
            plm["resources"] = StageResources.model_validate(plm.get("resources") or {}).over(self.resources).model_dump()
        return plm

    @model_validator(mode="after")
    def _check(self) -> PEConfig:
        from dpsynth_core.privacy.randomness import refuse_pinned_dp_seed

        if self.data.source == "file" and self.data.path is None and not self.data.party_paths:
            raise ValueError("data.path (or data.party_paths) is required when data.source is 'file'")
        if self.data.party_paths:
            if self.data.source != "file" or len(self.data.party_paths) < 2:
                raise ValueError("data.party_paths: list at least 2 files, with data.source: file")
            if self.federated_parties not in (1, len(self.data.party_paths)):
                raise ValueError("federated_parties must equal the number of data.party_paths")
            self.federated_parties = len(self.data.party_paths)
        refuse_pinned_dp_seed("noise_seed", self.noise_seed)
        self.plms = [PLMConfig.model_validate(self._plm_defaults(p.model_dump())) for p in self.plms]
        return self
