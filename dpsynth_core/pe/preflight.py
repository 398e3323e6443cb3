"""WASP's and Aug-PE's pre-flight (``runs.preflight``): config, prompts, delta and the whole private
file, checked before a run directory exists or Ray starts."""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.runs.preflight import Plan


def preflight_pe(config_path: Path, method: str) -> Plan:
    """``method``: ``wasp`` or ``augpe``."""
    from dpsynth_core.pe.data_split import load_frame, split_data
    from dpsynth_core.pe.pipeline import load_pe_config, resolve_delta
    from dpsynth_core.pe.prompts import load_prompts
    from dpsynth_core.runs.storage import require_durable_run_dir

    cfg = load_pe_config(config_path, method)
    run_dir = require_durable_run_dir(cfg.run_dir)
    delta = resolve_delta(cfg)
    load_prompts(cfg.prompts)
    split_data(cfg)  # whole file validated; the drawn set is discarded
    vote = "Top-Q contrastive vote" if method == "wasp" else "nearest-neighbour vote"
    stages = [f"{cfg.iterations} x (generate with {len(cfg.plms)} PLM(s) -> DP {vote})", "synthetic.jsonl"]
    if cfg.evaluate:
        stages.append("evaluate")
    source = str(cfg.data.path) if cfg.data.source == "file" else "bioRxiv (data dir)"
    return Plan(method, Path(config_path), stages, cfg.epsilon, delta, source, len(load_frame(cfg)[0]), run_dir)
