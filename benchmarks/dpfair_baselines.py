"""AIM baseline and real-data reference of a DPFairLLM config, without the LLM stages.

    python benchmarks/dpfair_baselines.py configs/dpfair_eps1.yaml

Same sample, columns, schema and (epsilon, delta) as ``dpsynth run dpfair`` would use; AIM gets its
own ledger (an alternative release). Writes ``<output_dir>/<name>-baselines/stages/{baseline,
reference}.done`` for ``benchmarks/dpfair_table.py``. Useful when the LLM stages are too slow for
the machine (or already done elsewhere).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", type=Path)
    args = ap.parse_args()

    from dpsynth_core.config import load_config
    from dpsynth_core.privacy import PrivacyLedger, default_delta
    from dpsynth_core.tabular.baseline import aim_synthesize
    from dpsynth_core.tabular.dp_domain import estimate_domain
    from dpsynth_core.tabular.evaluate import evaluate_table, marginal_tvd, summary_row, tstr
    from dpsynth_core.tabular.schema import load_schema
    from ray_jobs.dpfair import DpFairConfig, _load_tables, _mark

    cfg = load_config(args.config, DpFairConfig)
    schema = load_schema(cfg.schema_path).select(cfg.columns)
    sensitive = cfg.fairness.sensitive or schema.sensitive[0]
    run = Path(cfg.output_dir) / f"{cfg.name}-baselines"
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.yaml").write_text(args.config.read_text())
    train, test = _load_tables(cfg)
    delta = cfg.delta or default_delta(len(train))
    ledger = PrivacyLedger.open(run) if (run / "ledger.sqlite").is_file() else PrivacyLedger.create(run, f"{cfg.name}-aim", cfg.epsilon, delta)
    schema = estimate_domain(schema, train, epsilon=cfg.epsilon * cfg.budget.domain, ledger=ledger, seed=cfg.data.seed)
    private = schema.validate_frame(train, "adult (train)")
    real_test = schema.validate_frame(test, "real test")
    t0 = time.time()
    synth = aim_synthesize(private, schema, epsilon=ledger.remaining_epsilon(), ledger=ledger,
                           num_rows=cfg.generation.num_rows, bins=cfg.baseline.bins, seed=cfg.data.seed)
    secs = time.time() - t0
    report = evaluate_table(synth, private, real_test, schema, out_dir=run / "eval", privacy=cfg.evaluate_privacy)
    _mark(run, "baseline", {"method": "aim", "epsilon": ledger.total_epsilon(), "delta": ledger.delta, "seconds": secs,
                            "valid_fraction": 1.0, **summary_row(report, sensitive)})
    ref = {"tstr": tstr(private, real_test, schema, cfg.data.seed)}
    holdout = real_test.sample(min(len(real_test), cfg.generation.num_rows), random_state=cfg.data.seed)
    ref["fidelity"] = marginal_tvd(holdout, private, schema)
    _mark(run, "reference", {"method": "real data", "epsilon": None, "valid_fraction": 1.0, **summary_row(ref, sensitive)})
    print(json.dumps({"run": str(run), "aim_seconds": round(secs, 1), "epsilon_spent": ledger.total_epsilon()}))


if __name__ == "__main__":
    main()
