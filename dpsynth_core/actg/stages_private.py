"""ACTG-ARL's first stages: the public schema, and ``private``, the only stage that reads private
records (attribute extraction in memory, AIM under eps1, DP-SGD under eps2); and the owner-side
evaluation. Each takes (config, run dir) and returns a small JSON summary (never a private value)."""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.actg.config import ActgConfig
from dpsynth_core.actg.data_split import load_private_split
from dpsynth_core.actg.run_files import RunDir, load_run_schema, set_torch_threads
from dpsynth_core.run_loop.reserve import adopt_reservations


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
    adopt_reservations(ledger, rd.root, "private")  # the loop reserved plan_private's events: recorded against them
    train, _, public_size = load_private_split(cfg)
    texts = [str(t)[: cfg.data.max_chars] for t in train[cfg.data.text_col]]
    schema = load_run_schema(cfg, rd.root) if cfg.mode == "actg" else None
    attrs = feature_attrs = None
    if cfg.mode == "actg" and not (rd.done("features") and (rd.done("dp_generator") or
                                                          cfg.generator_mode == "direct_prompt")):
        from dpsynth_core.actg.extractors import build_extractor

        # private: the attributes stay in memory. AIM learns the table of `feature_attrs`; the generator is
        # trained on `attrs`, each record's most likely options (they differ only for the supervised extractor)
        if cfg.extractor.kind == "columns":  # the records' own labels (bioRxiv: the oracle's)
            from dpsynth_core.actg.supervised import columns_attributes

            attrs = feature_attrs = columns_attributes(train, schema)
        elif cfg.extractor.kind == "supervised":  # fitted on the declared-public file by stage reward_model
            from dpsynth_core.actg.supervised import SupervisedExtractor
            from dpsynth_core.privacy.randomness import secure_rng

            model = SupervisedExtractor.load(rd.reward_model, schema)
            attrs, feature_attrs = model.extract_and_draw(texts, secure_rng())
        else:
            attrs = feature_attrs = build_extractor(cfg.extractor, schema).extract(texts)
    if cfg.mode == "actg" and not rd.done("features"):
        rd.mark("features", _run_features(cfg, rd, schema, feature_attrs, ledger, public_size))
    if not rd.done("dp_generator"):
        rd.mark("dp_generator", _run_dp_generator(cfg, rd, schema, texts, attrs, ledger, public_size))
    del attrs, feature_attrs, texts, train
    return {"features": rd.summary("features"), "dp_generator": rd.summary("dp_generator")}


def plan_private(cfg: ActgConfig, ledger):
    """The events ``stage_private`` will record, for the run loop to reserve before any stage runs
    (``run_loop.reserve``): the features (AIM's rho under eps1, or the feature LM's DP-SGD), then the
    generator's DP-SGD under eps2, each planned as the stage plans it, q from the public n_records. A
    generator: the loop holds the features' event before the generator's is planned, so that the
    generator's noise fits what the features leave (``ledger`` is the loop's ``PlanningView``). Nothing for
    a part done or closed from its outputs (never charged again), a reference run, or direct prompting."""
    from dpsynth_core.dpsgd.budget import plan_for_units

    if cfg.is_reference:
        return
    rd, n = RunDir(cfg.resolved_run_dir()), cfg.data.n_records
    if cfg.mode == "actg" and not rd.done("features") and not _features_closed(cfg, rd, ledger):
        if cfg.features.generator != "dp_ft":
            from dpsynth_core.actg.features import aim_rho
            from dpsynth_core.privacy import ZCdpEvent

            yield "features", ZCdpEvent(rho=aim_rho(cfg.epsilon_features, float(ledger.delta)))
        elif not _adapter_written(rd.root / "feature_lm"):  # a trained feature LM is sampled again, not charged
            dp = cfg.feature_lm_config(cfg.epsilon_features).model_copy(update={"public_num_units": n})
            yield "features", plan_for_units(dp, n, False, ledger=ledger, stage="features").event()
    if cfg.generator_mode == "dp_ft" and not rd.done("dp_generator") and not _generator_closed(cfg, rd, ledger):
        dp = cfg.dpsgd_config(cfg.epsilon_generator).model_copy(update={"public_num_units": n})
        yield "dp_generator", plan_for_units(dp, n, False, ledger=ledger, stage="dp_generator").event()


def _ledger_has(ledger, stage: str) -> bool:
    return any(e.stage == stage for e in ledger.entries())


def _adapter_written(out_dir: Path) -> bool:
    return (out_dir / "adapter" / "adapter_config.json").is_file()


def _features_closed(cfg: ActgConfig, rd: RunDir, ledger) -> bool:
    """Charged and written, its marker lost (a crash between the two): closed from its outputs."""
    return (_ledger_has(ledger, "features") or cfg.is_reference) and rd.features.is_file()


def _generator_closed(cfg: ActgConfig, rd: RunDir, ledger) -> bool:
    return (_ledger_has(ledger, "dp_generator") or cfg.is_reference) and _adapter_written(rd.generator)


def _run_features(cfg: ActgConfig, rd: RunDir, schema, attrs: list[dict], ledger, public_size: int) -> dict:
    """AIM (or the DP-FT feature LM) under eps1 -> features.csv (+ d_JS of 1- and 2-way marginals
    vs the real attributes); an epsilon = inf run without noise (``reference.py``)."""
    import pandas as pd

    from dpsynth_core.actg import features

    if _features_closed(cfg, rd, ledger):
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
    if _generator_closed(cfg, rd, ledger):
        return {"adapter_dir": str(rd.generator / "adapter"), "closed_from_outputs": True}
    examples = build_train_examples(texts, attrs, schema, cfg.template_text(),
                                    text_description=cfg.data.text_description)
    # q and delta from the public expected size: the drawn set's size must not reach the ledger
    dp = cfg.dpsgd_config(cfg.epsilon_generator).model_copy(update={"public_num_units": public_size})
    if cfg.is_reference:
        from dpsynth_core.dpsgd.noiseless import train_noiseless_lora

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

