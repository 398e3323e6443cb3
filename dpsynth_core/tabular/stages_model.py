"""DPFairLLM's model stage: train (optional public stage 1, then DP-SGD with the fairness penalty) and
generate (constrained, fairness-aware, optionally raked to the DP marginals) in one process."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from dpsynth_core.errors import ConfigError
from dpsynth_core.run_loop.reserve import adopt_reservations
from dpsynth_core.runs import StageMarkers
from dpsynth_core.runs.files import atomic_write_text
from dpsynth_core.tabular import private_data
from dpsynth_core.tabular.config import DpFairConfig, GenerationSettings
from dpsynth_core.tabular.run_schema import resolved_schema
from dpsynth_core.tabular.schema import TableSchema
from dpsynth_core.tabular.stages_dp import MARGINALS_FILE, run_column_order, run_ledger, run_strata, write_csv

if TYPE_CHECKING:  # imported where used: generation needs torch, calibration only numpy
    from dpsynth_core.tabular.calibrate import CalibrationResult
    from dpsynth_core.tabular.fairness import FairnessTargets
    from dpsynth_core.tabular.generation import StratumQuota

log = logging.getLogger(__name__)
# a released table that misses a DP margin by this share of its rows, for want of pool rows, is worth a word
SHORTFALL_NOTICE = 0.25
POOL_FILE = "generated_pool.csv"  # generation.calibrate: every generated row, before raking and selection


def stage_model(cfg: DpFairConfig, root: str) -> dict:
    """``train`` then ``generate`` in one process (the model is loaded once): the Ray task.

    Reads the private rows from their source itself; its arguments are the config and a path.
    """
    from dpsynth_core.config.placement import apply_torch_threads

    from dpsynth_core.tabular.serialize import RowSerializer

    # A forced device this process cannot see fails here, before the private rows are read.
    cfg.placement.resolve()
    run = Path(root)
    marks = StageMarkers(run)
    schema = resolved_schema(run)
    if cfg.generation.calibrate.auto_stratify:  # its chosen columns are written first
        schema = schema.select(run_column_order(cfg, run, schema))
    ser = RowSerializer(schema, separator=cfg.serialization.separator, prefix=cfg.serialization.prefix,  # type: ignore[arg-type]
                        random_order=cfg.serialization.random_order, seed=cfg.training.seed)
    apply_torch_threads(cfg.training.torch_threads)
    if not marks.done("train"):
        base, public = _public_stage(cfg, run, schema)
        marks.mark("train", {**_train(cfg, run, schema, ser, base), "base_model": base, "public_stage": public})
    train = marks.summary("train")
    if not marks.done("generate"):
        marks.mark("generate", _generate(cfg, run, ser, Path(train["adapter_dir"]), train.get("base_model", cfg.training.model)))
    return {"train": marks.summary("train"), "generate": marks.summary("generate")}


def _public_stage(cfg: DpFairConfig, run: Path, schema: TableSchema) -> tuple[str, dict | None]:
    """Stage 1 (no private data, nothing in the ledger): the model DP-SGD starts from, and a summary.

    The merged model is cached beside the run directory under the hash of its public inputs."""
    from dpsynth_core.tabular.public_stage import stage_key, train_public_stage
    from dpsynth_core.tabular.serialize import RowSerializer

    t, s = cfg.training, cfg.serialization
    if not t.public_stage.steps:
        return t.model, None
    ser = RowSerializer(schema, separator=s.separator, prefix=s.prefix, random_order=s.random_order, seed=t.seed)  # type: ignore[arg-type]
    marginals = None
    if t.public_stage.rows_from == "dp_marginals":  # this run's DP release: the cache key is per run
        marginals = json.loads((run / MARGINALS_FILE).read_text())
    settings = {**t.public_stage.model_dump(mode="json"), "lora": t.lora.model_dump(mode="json"), "max_seq_len": t.max_seq_len,
                **({"marginals": marginals} if marginals else {})}
    key = stage_key(t.model, schema, settings, {**s.model_dump(mode="json"), "seed": t.seed})
    out = run.parent / ".public_stage" / key
    summary = train_public_stage(t.model, ser, t.public_stage, t.lora, out, max_seq_len=t.max_seq_len,
                                 placement=cfg.placement.resolve(), marginals=marginals)
    settings.pop("marginals", None)  # in the run directory already (dp_marginals.json)
    atomic_write_text(run / "public_stage.json", json.dumps({"base_model": t.model, "key": key, "settings": settings,
                                                             "serialization": s.model_dump(mode="json"), **summary}, indent=2))
    return str(out / "model"), {"key": key, **summary}


def dpsgd_config(cfg: DpFairConfig, base_model: str, ledger):
    """DP-SGD is the last DP stage: start from what the ledger leaves by plain subtraction, then fill_budget
    lowers the noise until the ledger's (sub-additive) composed total reaches the budget."""
    from dpsynth_core.dpsgd import DpSgdConfig

    t = cfg.training
    return DpSgdConfig(
        model=base_model, lora=t.lora, steps=t.steps,
        epsilon=math.inf if cfg.is_reference else ledger.remaining_epsilon() * 0.995,
        expected_batch_size=t.expected_batch_size, physical_batch_size=t.physical_batch_size,
        learning_rate=t.learning_rate, max_grad_norm=t.max_grad_norm, clipping=t.clipping,  # type: ignore[arg-type]
        max_seq_len=t.max_seq_len, seed=t.seed, torch_threads=t.torch_threads, fill_budget=True,
        device=cfg.placement.device, dtype=cfg.placement.dtype,
        public_num_units=private_data.public_size(cfg),  # q from m: the drawn size stays out of the ledger
    )


def plan_model(cfg: DpFairConfig, ledger) -> list:
    """The DP-SGD event ``_train`` will record, for the run loop to reserve before any stage runs
    (``run_loop.reserve``): planned as the stage plans it, against what the ledger will leave once the DP
    measurements (planned before it) are recorded. Its LoRA targets are checked on ``training.model``, the
    architecture of stage 1's merged model. None for a reference run, or once trained or charged (a resume)."""
    from dpsynth_core.dpsgd.budget import plan_for_units

    charged = any(e.stage == "dpsgd" for e in ledger.entries())
    if cfg.is_reference or charged or StageMarkers(cfg.run_dir()).done("train"):
        return []
    m = private_data.public_size(cfg)
    return [("dpsgd", plan_for_units(dpsgd_config(cfg, cfg.training.model, ledger), m, False, ledger=ledger,
                                     stage="dpsgd").event())]


def _train(cfg: DpFairConfig, run: Path, schema: TableSchema, ser, base_model: str) -> dict:
    from dpsynth_core.dpsgd import TrainExample, train_dp_lora

    t, ledger = cfg.training, run_ledger(run)
    adopt_reservations(ledger, run, "model")  # the loop reserved plan_model's event: trained with its noise
    private = private_data.load_private(cfg, run, schema)
    examples = [TrainExample(prompt=p, target=x) for p, x in ser.examples(private)]
    penalty = eo = None
    if cfg.fairness.enabled:
        from dpsynth_core.models import load_tokenizer
        from dpsynth_core.tabular.constrained import RowConstraint
        from dpsynth_core.tabular.fair_eo import GeneratedRowsEO
        from dpsynth_core.tabular.fairness import FairnessPenalty, load_targets

        f = cfg.fairness
        targets = load_targets((run / "fair_targets.json").read_text())
        constraint = RowConstraint(ser, load_tokenizer(base_model))
        if f.any_weight("eo"):  # constants from rows the model being trained generates (no privacy cost)
            eo = GeneratedRowsEO(constraint, [x.sensitive for x in targets], targets[0].label_prior or targets[0].target_y,
                                 rows=f.eo_rows, refresh_every=f.eo_refresh_every, seed=t.seed)
        penalty = FairnessPenalty(constraint, schema, targets, f.lambda_dp, f.lambda_eo, eo=eo)
    dcfg = dpsgd_config(cfg, base_model, ledger)
    if cfg.is_reference:  # epsilon = inf (not_private: true): the same training, sigma = 0, no clipping
        from dpsynth_core.dpsgd.noiseless import train_noiseless_lora

        res = train_noiseless_lora(examples, dcfg, output_dir=run / "train", ledger=ledger, stage="dpsgd",
                                   per_example_penalty=penalty)
    else:
        res = train_dp_lora(examples, dcfg, output_dir=run / "train", ledger=ledger, stage="dpsgd",
                            per_example_penalty=penalty)
    return {"epsilon": res.epsilon, "noise_multiplier": res.noise_multiplier, "steps": res.steps,
            "adapter_dir": str(res.adapter_dir), **({"eo_refreshes": eo.history} if eo is not None else {})}


def _generate(cfg: DpFairConfig, run: Path, ser, adapter: Path, base_model: str) -> dict:
    from dpsynth_core.engines.adapters import load_hf_model
    from dpsynth_core.privacy import PostProcessingEvent
    from dpsynth_core.tabular.generation import generate_rows

    ledger = run_ledger(run)
    g = _generation_settings(cfg, run)
    model, tok = load_hf_model(base_model, adapter, cfg.placement.resolve())
    ledger.check("generate", PostProcessingEvent())
    t0 = time.time()
    calibration = None
    if g.calibrate.enabled:  # a larger pool, raked to the DP marginals, num_rows of it released
        pool_rows = math.ceil(g.num_rows * g.calibrate.pool_factor)
        gen = generate_rows(model, tok, ser, g.model_copy(update={"num_rows": pool_rows}), strata=_strata(cfg, run))
        # kept beside the release (generated rows: post-processing, no private row) so calibration
        # settings can be compared without generating again
        write_csv(gen.frame, run / POOL_FILE)
        calibration = _calibrate(cfg, run, ser.schema, gen.frame)
        frame = calibration.frame
        warn_on_shortfall(calibration)
    else:
        gen = generate_rows(model, tok, ser, g)
        frame = gen.frame
    write_csv(frame, run / "synthetic.csv")
    ledger.record("generate", PostProcessingEvent(), details={"rows": len(frame)})
    return {"rows": len(frame), "attempted": gen.attempted, "invalid": gen.invalid, "rejected": gen.rejected,
            "valid_fraction": gen.valid_fraction, "seconds": time.time() - t0, "gap_history": gen.gap_history[-5:],
            **({"calibration": calibration.summary()} if calibration is not None else {}),
            **({"target_rates": g.fairness.target_rates} if cfg.generation.fairness.rate_mix > 0 else {}),
            **({"stratify": list(run_strata(cfg, run, resolved_schema(run)))} if g.calibrate.stratify else {})}


def _generation_settings(cfg: DpFairConfig, run: Path) -> GenerationSettings:
    """``cfg.generation`` with ``fairness.rate_mix`` turned into per-group target rates (from the run's DP
    releases of the (A, Y) table, pooled: post-processing)."""
    g = cfg.generation
    mix = g.fairness.rate_mix
    if mix <= 0 or not g.fairness.enabled:
        return g
    from dpsynth_core.tabular.fairness import load_targets

    schema = resolved_schema(run)
    targets = {t.sensitive: t for t in load_targets((run / "fair_targets.json").read_text())}
    rates = {a: _pooled_targets(cfg, run, schema, targets[a]).mixed_rates(schema.positive(), mix)
             for a in g.fairness.attributes(schema.sensitive)}
    return g.model_copy(update={"fairness": g.fairness.with_rates(rates)})


def _pooled_targets(cfg: DpFairConfig, run: Path, schema: TableSchema, fair: FairnessTargets) -> FairnessTargets:
    """``fair``'s (A, Y) table estimated from every release of it in this run (``tabular.dp_pooling``:
    the fairness statistics, the marginals' 2-way and 1-way tables, with the noise scales the ledger
    recorded). A run from before the fairness statistics kept their counts: ``fair`` itself."""
    from dpsynth_core.tabular.dp_pooling import group_label_measurements, pooled_group_label_counts
    from dpsynth_core.tabular.fairness import FairnessTargets

    if fair.counts is None or cfg.is_reference:  # a reference run's table is exact: nothing to pool
        return fair
    sigmas = _noise_scales(run)
    marginals = json.loads((run / MARGINALS_FILE).read_text()) if (run / MARGINALS_FILE).is_file() else None
    groups = list(fair.counts)
    measurements = group_label_measurements(
        fair.sensitive, schema.target, groups, fair.labels, fair_counts=fair.counts, fair_sigma=sigmas.get("dp_fair_stats"),
        marginals=marginals, marginals_sigma=sigmas.get("dp_marginals"))
    if not any(m.design.shape[0] == m.design.shape[1] for m in measurements):  # no whole table: nothing to pool
        return fair
    counts = pooled_group_label_counts(groups, fair.labels, measurements)
    return FairnessTargets.from_counts(counts, fair.sensitive, target_y=cfg.fairness.target_y)


def _noise_scales(run: Path) -> dict[str, float]:
    """Per stage, the Gaussian noise sd per cell the ledger recorded for its release (public: a function
    of its epsilon, delta and compositions); a stage recorded twice: its last entry."""
    return {e.stage: float(e.details["sigma"]) for e in run_ledger(run).entries() if "sigma" in e.details}


def _noise_sd(run: Path, stage: str) -> float:
    """:func:`_noise_scales` of one stage; a ledger without it is an error, not a silent 0."""
    sigma = _noise_scales(run).get(stage)
    if sigma is None:
        raise ConfigError(f"{run}: the ledger has no noise scale for stage '{stage}'")
    return sigma


def _strata(cfg: DpFairConfig, run: Path) -> StratumQuota | None:
    """``calibrate.stratify``'s quota: one column's DP 1-way marginal, or two columns' DP 2-way table
    (post-processing of the marginals stage)."""
    cal = cfg.generation.calibrate
    columns = run_strata(cfg, run, resolved_schema(run)) if cal.auto_stratify else cal.stratify_columns
    if not columns:
        return None
    from dpsynth_core.tabular.generation import StratumQuota

    marginals = json.loads((run / MARGINALS_FILE).read_text())
    if len(columns) == 1:
        entry = marginals[columns[0]]
        return StratumQuota(columns, {str(v): float(c) for v, c in zip(entry["values"], entry["counts"])})
    pairs = marginals.get("pairs") or {}
    entry = pairs.get("|".join(columns)) or pairs.get("|".join(reversed(columns)))
    if entry is None:  # the config check makes the marginals stage release it; a run from before may not have
        raise ConfigError(f"generation.calibrate.stratify: {MARGINALS_FILE} has no 2-way table of {list(columns)}")
    first, second = (marginals[c]["values"] for c in entry["columns"])
    counts = np.asarray(entry["counts"], float).reshape(len(first), len(second))
    cells = {(str(a), str(b)): counts[i, j] for i, a in enumerate(first) for j, b in enumerate(second)}
    if tuple(entry["columns"]) != columns:
        cells = {(b, a): v for (a, b), v in cells.items()}
    return StratumQuota(columns, cells)


def warn_on_shortfall(calibration: CalibrationResult) -> None:
    """One line when the pool cannot supply a DP margin's cells (names a DP table and a share: nothing private)."""
    margin, share = calibration.worst_shortfall()
    if share > SHORTFALL_NOTICE:
        log.warning("generation.calibrate: the %d generated rows lack %.0f%% of what the DP table '%s' asks of the "
                    "%d released rows (cells the generator rarely writes, or noise on rare cells); a larger "
                    "generation.calibrate.pool_factor helps the first", calibration.pool_rows, 100 * share, margin,
                    len(calibration.frame))


def _calibrate(cfg: DpFairConfig, run: Path, schema: TableSchema, pool: pd.DataFrame):
    """Rake the generated pool to the run's DP marginals (and, for fair generation, to demographic parity)."""
    from dpsynth_core.tabular.calibrate import calibrate_rows, fairness_margins, margins_from_dp, pair_margins_from_dp, rake

    g = _generation_settings(cfg, run)
    marginals = json.loads((run / MARGINALS_FILE).read_text())
    margins = margins_from_dp(marginals, schema)
    fair, parity = g.fairness, []
    if g.calibrate.fairness and fair.enabled and schema.target is not None:
        parity = fair.attributes(schema.sensitive)
        margins += fairness_margins(marginals, parity, schema.target,
                                    {a: fair.targets_for(a, parity) for a in parity}, schema.positive())
    margins += pair_margins_from_dp(marginals, schema, skip=tuple(parity))  # none unless pairs_with_target
    if g.calibrate.labels == "dp_tables":  # the pool's labels from the DP tables, before raking and selection
        from dpsynth_core.tabular.labeller import relabel_from_dp_tables

        single = parity[0] if len(parity) == 1 else None
        weights = None
        if g.calibrate.label_cut == "raked":  # the feature tables only: the label is what is being set
            weights, _ = rake(pool, [m for m in margins if schema.target not in m.columns])
        prior_rows = g.calibrate.label_prior * _noise_sd(run, "dp_marginals") if g.calibrate.label_prior and not cfg.is_reference else 0.0
        pool = relabel_from_dp_tables(pool, marginals, schema.target, schema.positive(), skip=tuple(parity),
                                      group_by=tuple(parity), rates=fair.targets_for(single, parity) if single else None,
                                      seed=g.seed, weights=weights,
                                      prior_rows=prior_rows)
    return calibrate_rows(pool, margins, g.num_rows, seed=g.seed, select="balanced")

