"""DPFairLLM's and the AIM baseline's pre-flights (``runs.preflight``): config, the public schema,
delta and the whole private file against the schema, checked before a run directory exists."""

from __future__ import annotations

from pathlib import Path

from dpsynth_core.run_loop.former import refuse_former_run
from dpsynth_core.runs.preflight import Plan


def preflight_dpfair(config_path: Path) -> Plan:
    from dpsynth_core.tabular import private_data
    from dpsynth_core.tabular.config import load_dpfair_config
    from dpsynth_core.tabular.pipeline import stages_to_run
    from dpsynth_core.tabular.run_schema import public_schema

    cfg = load_dpfair_config(config_path)
    refuse_former_run(cfg.run_dir(), cfg.former_run_dir())  # before the private file is read
    schema = public_schema(cfg)
    rows, delta = private_data.preflight(cfg, schema)
    return Plan("dpfair", Path(config_path), stages_to_run(cfg, schema), cfg.epsilon, delta,
                private_data.source_name(cfg), rows, cfg.run_dir())


def preflight_aim(config_path: Path) -> Plan:
    from dpsynth_core.tabular import private_data
    from dpsynth_core.tabular.aim_run import AimMethod
    from dpsynth_core.tabular.config import load_aim_config
    from dpsynth_core.tabular.schema import load_schema

    cfg = load_aim_config(config_path)
    refuse_former_run(cfg.run_dir(), cfg.former_run_dir())  # before the private file is read
    schema = load_schema(cfg.schema_path).select(cfg.columns)
    rows, delta = private_data.preflight(cfg, schema)
    stages = [s.name for s in AimMethod(cfg).stages()]
    return Plan("aim", Path(config_path), stages, cfg.epsilon, delta, private_data.source_name(cfg), rows,
                cfg.run_dir())
