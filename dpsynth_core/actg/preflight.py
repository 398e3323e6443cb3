"""ACTG's pre-flight (``runs.preflight``): config, schema, prompt template, delta and the whole private
file, checked before a run directory exists or Ray starts."""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.runs.preflight import Plan


def preflight_actg(config_path: Path) -> Plan:
    from dpsynth_core.actg.data_split import load_frame, load_private_split
    from dpsynth_core.actg.pipeline import load_actg_config
    from dpsynth_core.actg.schema import load_schema
    from dpsynth_core.privacy import check_delta_for_size, default_delta
    from dpsynth_core.runs.storage import require_durable_run_dir

    cfg = load_actg_config(config_path)
    run_dir = require_durable_run_dir(cfg.resolved_run_dir())
    if cfg.mode == "actg":
        load_schema(cfg.resolved(cfg.schema_path))
    cfg.template_text()
    m = cfg.data.n_records
    delta = check_delta_for_size(cfg.privacy.delta, m, "privacy.delta") if cfg.privacy.delta else default_delta(m)
    rows = len(load_frame(cfg))  # the whole file, validated
    load_private_split(cfg)  # held-out and private sets fit (the drawn set is discarded)
    return Plan("actg", Path(config_path), list(cfg.stages), cfg.privacy.epsilon, delta,
                str(cfg.data.path or "bioRxiv (data dir)"), rows, run_dir,
                notes=tuple(n for n in (cfg.extractor_note(),) if n))
