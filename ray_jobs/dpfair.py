"""DPFairLLM driver: DP and fair tabular synthesis with a DP-SGD fine-tuned LLM.

    dpsynth run dpfair --config configs/dpfair_demo.yaml

Stages (each leaves ``stages/<name>.done``; a rerun skips finished stages):

1. ``prepare``   load + validate the private table (sample of ``train_rows``), resolve ``domain: dp``
                 columns of the schema under DP (Gaussian histogram; ledger)
2. ``fair_stats`` DP (A, Y) table for the fairness targets (ledger), only if a fairness term is on
3. ``train``     DP-SGD LoRA fine-tuning with the fairness penalty (ledger: DpSgdEvent)
4. ``generate``  constrained, fairness-aware generation on a Ray worker (post-processing)
5. ``evaluate``  TSTR / TVD / fairness / DCR+MIA report with plots (owner-side, not a release)
6. ``baseline``  AIM at the same (epsilon, delta) in its *own* ledger (an alternative release)
7. ``reference`` the TSTR classifiers trained on the real sample instead (owner-side reference)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
from pydantic import Field

from dpsynth_core.config import StrictConfig, load_config
from dpsynth_core.dpsgd.config import LoraSettings
from dpsynth_core.errors import ConfigError
from dpsynth_core.tabular.generation import GenerationSettings
from dpsynth_core.tabular.schema import TableSchema, load_schema


class DataSettings(StrictConfig):
    source: str = "adult"  # "adult" or a CSV/JSONL/Parquet path
    test_path: str | None = None  # for non-adult sources: the real test table
    train_rows: int | None = Field(None, ge=10)
    test_rows: int | None = Field(None, ge=10)
    seed: int = 0


class BudgetSplit(StrictConfig):
    domain: float = Field(0.05, ge=0, lt=1)  # fraction of epsilon for `domain: dp` columns (if any)
    fair_stats: float = Field(0.05, ge=0, lt=1)  # fraction for the (A, Y) table (if fairness is on)


class SerializationSettings(StrictConfig):
    separator: str = ", "
    prefix: str = "names"
    random_order: bool = False


class TrainingSettings(StrictConfig):
    model: str = "smollm2-135m-instruct"
    lora: LoraSettings = Field(default_factory=LoraSettings)
    steps: int = Field(30, ge=1)
    expected_batch_size: int = Field(32, ge=1)
    physical_batch_size: int = Field(16, ge=1)
    learning_rate: float = Field(2e-3, gt=0)
    max_grad_norm: float = Field(1.0, gt=0)
    clipping: str = "ghost"
    max_seq_len: int = Field(128, ge=16)
    seed: int = 0
    torch_threads: int | None = 2


class FairnessSettings(StrictConfig):
    lambda_dp: float = Field(0.0, ge=0)
    lambda_eo: float = Field(0.0, ge=0)
    sensitive: str | None = None
    target_y: dict[str, float] | None = None  # public target P(Y); default: DP-estimated P(Y)


class BaselineSettings(StrictConfig):
    aim: bool = True
    bins: int = Field(16, ge=2)


class DpFairConfig(StrictConfig):
    name: str = "dpfair"
    output_dir: str = "runs/dpfair"
    schema_path: str = "configs/schemas/adult.yaml"
    columns: list[str] | None = None
    data: DataSettings = Field(default_factory=DataSettings)
    epsilon: float = Field(..., gt=0)
    delta: float | None = None
    budget: BudgetSplit = Field(default_factory=BudgetSplit)
    serialization: SerializationSettings = Field(default_factory=SerializationSettings)
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    fairness: FairnessSettings = Field(default_factory=FairnessSettings)
    generation: GenerationSettings = Field(default_factory=GenerationSettings)
    baseline: BaselineSettings = Field(default_factory=BaselineSettings)
    evaluate_privacy: bool = True
    evaluate_reference: bool = True  # also train the TSTR classifiers on the real sample (a reference row)
    use_ray: bool = True


# ---- helpers ---------------------------------------------------------------------------------
def _done(run_dir: Path, stage: str) -> bool:
    return (run_dir / "stages" / f"{stage}.done").is_file()


def _mark(run_dir: Path, stage: str, info: dict | None = None) -> None:
    d = run_dir / "stages"
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f"{stage}.done.tmp"
    tmp.write_text(json.dumps({"finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(info or {})}, indent=2))
    tmp.replace(d / f"{stage}.done")


def _write_csv(df: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    df.to_csv(tmp, index=False)
    tmp.replace(path)


def _load_tables(cfg: DpFairConfig) -> tuple[pd.DataFrame, pd.DataFrame]:
    if cfg.data.source == "adult":
        from dpsynth_core.data import load_adult

        train, test = load_adult("train"), load_adult("test")
    else:
        from dpsynth_core.data import load_records

        if not cfg.data.test_path:
            raise ConfigError("field 'data.test_path': needed when data.source is a file")
        train, test = load_records(cfg.data.source), load_records(cfg.data.test_path)
    if cfg.data.train_rows and cfg.data.train_rows < len(train):
        train = train.sample(cfg.data.train_rows, random_state=cfg.data.seed)
    if cfg.data.test_rows and cfg.data.test_rows < len(test):
        test = test.sample(cfg.data.test_rows, random_state=cfg.data.seed + 1)
    return train.reset_index(drop=True), test.reset_index(drop=True)


def _run_dir(cfg: DpFairConfig, config_path: Path, resume: bool) -> Path:
    base = Path(cfg.output_dir) / cfg.name
    if not resume and base.exists():
        base = base.with_name(f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    base.mkdir(parents=True, exist_ok=True)
    (base / "config.yaml").write_text(Path(config_path).read_text())
    return base


def _ledger(run_dir: Path, cfg: DpFairConfig, n: int):
    from dpsynth_core.privacy import PrivacyLedger, default_delta

    if (run_dir / "ledger.sqlite").is_file():
        return PrivacyLedger.open(run_dir)
    return PrivacyLedger.create(run_dir, cfg.name, cfg.epsilon, cfg.delta or default_delta(n))


def _train_and_generate(cfg_dict: dict, run_dir: str, schema_dict: dict, targets: dict | None, private: pd.DataFrame) -> dict:
    """Stages 3-4 (one process, so the model is loaded once); runs as a Ray task when use_ray.

    ``private`` travels in memory (Ray's object store), never as a file in the run directory.
    """
    import torch

    from dpsynth_core.dpsgd import DpSgdConfig, TrainExample, load_generator, train_dp_lora
    from dpsynth_core.privacy import PostProcessingEvent, PrivacyLedger
    from dpsynth_core.tabular.constrained import RowConstraint
    from dpsynth_core.tabular.fairness import FairnessPenalty, FairnessTargets
    from dpsynth_core.tabular.generation import generate_rows
    from dpsynth_core.tabular.serialize import RowSerializer

    cfg = DpFairConfig.model_validate(cfg_dict)
    run = Path(run_dir)
    schema = TableSchema.model_validate(schema_dict)
    ser = RowSerializer(schema, separator=cfg.serialization.separator, prefix=cfg.serialization.prefix,  # type: ignore[arg-type]
                        random_order=cfg.serialization.random_order, seed=cfg.training.seed)
    ledger = PrivacyLedger.open(run)
    t = cfg.training
    if t.torch_threads:
        torch.set_num_threads(t.torch_threads)
    info: dict = {}
    if not _done(run, "train"):
        examples = [TrainExample(prompt=p, target=x) for p, x in ser.examples(private)]
        penalty = None
        if targets is not None:
            from dpsynth_core.models import load_tokenizer

            ft = FairnessTargets(**targets)
            penalty = FairnessPenalty(RowConstraint(ser, load_tokenizer(t.model)), schema, ft, cfg.fairness.lambda_dp, cfg.fairness.lambda_eo)
        # DP-SGD is the last DP stage: start from what is left by plain subtraction, then fill_budget
        # lowers the noise until the ledger's (sub-additive) composed total reaches the budget.
        eps_train = ledger.remaining_epsilon() * 0.995
        dcfg = DpSgdConfig(
            model=t.model, lora=t.lora, epsilon=eps_train, steps=t.steps, expected_batch_size=t.expected_batch_size,
            physical_batch_size=t.physical_batch_size, learning_rate=t.learning_rate, max_grad_norm=t.max_grad_norm,
            clipping=t.clipping, max_seq_len=t.max_seq_len, seed=t.seed, torch_threads=t.torch_threads,  # type: ignore[arg-type]
            fill_budget=True,
        )
        res = train_dp_lora(examples, dcfg, output_dir=run / "train", ledger=ledger, stage="dpsgd", per_example_penalty=penalty)
        info["train"] = {"epsilon": res.epsilon, "noise_multiplier": res.noise_multiplier, "steps": res.steps, "adapter_dir": str(res.adapter_dir)}
        _mark(run, "train", info["train"])
    adapter = Path(json.loads((run / "stages" / "train.done").read_text())["adapter_dir"])
    if not _done(run, "generate"):
        model, tok = load_generator(t.model, adapter)
        ledger.check("generate", PostProcessingEvent())
        t0 = time.time()
        gen = generate_rows(model, tok, ser, cfg.generation)
        _write_csv(gen.frame, run / "synthetic.csv")
        ledger.record("generate", PostProcessingEvent(), details={"rows": len(gen.frame)})
        info["generate"] = {"rows": len(gen.frame), "attempted": gen.attempted, "invalid": gen.invalid, "rejected": gen.rejected,
                            "valid_fraction": gen.valid_fraction, "seconds": time.time() - t0, "gap_history": gen.gap_history[-5:]}
        _mark(run, "generate", info["generate"])
    return info


def main(config_path: Path, resume: bool = True) -> Path:
    """Run the DPFairLLM pipeline; returns the run directory."""
    config_path = Path(config_path)
    cfg = load_config(config_path, DpFairConfig)
    schema = load_schema(cfg.schema_path).select(cfg.columns)
    fair_on = cfg.fairness.lambda_dp > 0 or cfg.fairness.lambda_eo > 0
    sensitive = cfg.fairness.sensitive or (schema.sensitive[0] if schema.sensitive else None)
    if fair_on and (sensitive is None or schema.target is None):
        raise ConfigError(f"{config_path}: fairness terms need a sensitive column and a target in the schema")
    if sensitive is not None:
        schema.column(sensitive)
    run = _run_dir(cfg, config_path, resume)
    # The private table is re-read from its source on every (re)run and kept in memory: the run
    # directory holds only public or DP outputs (and owner-side evaluation reports), never a copy.
    train, test = _load_tables(cfg)
    ledger = _ledger(run, cfg, len(train))

    # 1. prepare: validate; resolve `domain: dp` columns under DP
    if not _done(run, "prepare"):
        from dpsynth_core.tabular.dp_domain import estimate_domain

        resolved = estimate_domain(schema, train, epsilon=cfg.epsilon * cfg.budget.domain, ledger=ledger, seed=cfg.data.seed)
        resolved.validate_frame(train, f"{cfg.data.source} (train)")  # fail early, before any DP stage
        tmp = run / "schema_resolved.json.tmp"
        tmp.write_text(resolved.model_dump_json(indent=2))
        tmp.replace(run / "schema_resolved.json")
        _mark(run, "prepare", {"rows": len(train)})
    schema = TableSchema.model_validate_json((run / "schema_resolved.json").read_text())
    private = schema.validate_frame(train, f"{cfg.data.source} (train)")

    # 2. fairness targets from a DP (A, Y) table
    targets = None
    if fair_on:
        if not _done(run, "fair_stats"):
            from dpsynth_core.tabular.dp_domain import dp_group_label_table
            from dpsynth_core.tabular.fairness import FairnessTargets

            counts = dp_group_label_table(private, schema, sensitive,  # type: ignore[arg-type]
                                          epsilon=cfg.epsilon * cfg.budget.fair_stats, ledger=ledger, seed=cfg.data.seed)
            ft = FairnessTargets.from_counts(counts, sensitive, target_y=cfg.fairness.target_y)  # type: ignore[arg-type]
            tmp = run / "fair_targets.json.tmp"
            tmp.write_text(json.dumps(ft.__dict__, indent=2))
            tmp.replace(run / "fair_targets.json")
            _mark(run, "fair_stats")
        targets = json.loads((run / "fair_targets.json").read_text())

    # 3-4. train + generate (a Ray task, so the heavy work runs on a worker)
    if not (_done(run, "train") and _done(run, "generate")):
        args = (cfg.model_dump(), str(run), schema.model_dump(), targets, private)
        if cfg.use_ray:
            import ray

            started = not ray.is_initialized()
            if started:
                ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True,
                         runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                                   "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}})
            try:
                ray.get(ray.remote(num_cpus=1)(_train_and_generate).remote(*args))
            finally:
                if started:
                    ray.shutdown()
        else:
            _train_and_generate(*args)

    # 5. evaluate (owner-side report on real data; not a DP release)
    if not _done(run, "evaluate"):
        from dpsynth_core.tabular.evaluate import evaluate_table, summary_row

        synth = pd.read_csv(run / "synthetic.csv", keep_default_na=False)
        report = evaluate_table(synth, private, test, schema, out_dir=run / "eval", privacy=cfg.evaluate_privacy)
        gen_info = json.loads((run / "stages" / "generate.done").read_text())
        summary = {"method": "dpfairllm", "epsilon": ledger.total_epsilon(), "delta": ledger.delta,
                   "valid_fraction": gen_info["valid_fraction"], **(summary_row(report, sensitive) if sensitive and schema.target else {})}
        _mark(run, "evaluate", summary)

    # 6. AIM baseline at the same (epsilon, delta): its own ledger (an alternative release)
    if cfg.baseline.aim and not _done(run, "baseline"):
        from dpsynth_core.privacy import PrivacyLedger
        from dpsynth_core.tabular.baseline import aim_synthesize
        from dpsynth_core.tabular.evaluate import evaluate_table, summary_row

        bdir = run / "baseline_aim"
        bdir.mkdir(exist_ok=True)
        bledger = PrivacyLedger.open(bdir) if (bdir / "ledger.sqlite").is_file() else PrivacyLedger.create(bdir, f"{cfg.name}-aim", cfg.epsilon, ledger.delta)
        if not bledger.entries():  # AIM also uses the DP-estimated domain: charge it here too
            from dpsynth_core.privacy import event_from_dict

            for e in ledger.entries():
                if e.stage == "dp_domain":
                    bledger.record("dp_domain (shared)", event_from_dict(e.kind, e.params), details=e.details)
        aim_schema = schema
        synth = aim_synthesize(private, aim_schema, epsilon=bledger.remaining_epsilon(), ledger=bledger,
                               num_rows=cfg.generation.num_rows, bins=cfg.baseline.bins, seed=cfg.data.seed)
        _write_csv(synth, bdir / "synthetic.csv")
        report = evaluate_table(synth, private, test, schema, out_dir=bdir / "eval", privacy=cfg.evaluate_privacy)
        _mark(run, "baseline", {"method": "aim", "epsilon": bledger.total_epsilon(), "delta": bledger.delta,
                                "valid_fraction": 1.0, **(summary_row(report, sensitive) if sensitive and schema.target else {})})

    # 7. reference: the same classifiers trained on the real training sample (owner-side, no release);
    #    its TVD row is a real holdout sample of the synthetic size vs the training sample (the
    #    sampling floor a perfect generator would reach)
    if cfg.evaluate_reference and schema.target is not None and not _done(run, "reference"):
        from dpsynth_core.tabular.evaluate import marginal_tvd, summary_row, tstr

        real_test = schema.validate_frame(test, "real test")
        ref = {"tstr": tstr(private, real_test, schema, cfg.data.seed)}
        holdout = real_test.sample(min(len(real_test), cfg.generation.num_rows), random_state=cfg.data.seed)
        ref["fidelity"] = marginal_tvd(holdout, private, schema)
        _mark(run, "reference", {"method": "real data", "epsilon": None, "valid_fraction": 1.0,
                                 **(summary_row(ref, sensitive) if sensitive else {})})

    tmp = run / "ledger.txt.tmp"
    tmp.write_text(ledger.render())
    tmp.replace(run / "ledger.txt")
    return run
