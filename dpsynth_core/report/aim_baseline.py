"""The AIM baseline of a table run's fairness section: ``dpsynth report RUN_DIR --baseline AIM_RUN_DIR``.

An AIM run (``dpsynth run aim``) evaluates its synthetic table with the same TSTR classifiers (same seed) on the real
test rows its config draws. Its gaps sit beside this run's only when both runs saw the same table: same columns,
target and test-row settings (so the same test rows); anything else is refused with one line naming the
difference (config keys and column names only: public config, never a value of a row).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from dpsynth_core.errors import ConfigError
from dpsynth_core.report.inputs import RunFacts, read_run

# the data keys that decide which real rows are the test rows (tabular.private_data.load_test)
TEST_ROW_KEYS = ("source", "path", "test_path", "holdout_rows", "test_rows", "seed")


@dataclass
class AimBaseline:
    run_dir: Path
    epsilon: float
    tstr: dict  # the AIM run's eval/report.json "tstr": gboost / logreg gaps, baseline accuracy, n_test
    n_synthetic: int | None

    def gap(self, model: str, kind: str, attribute: str) -> float | None:
        return (self.tstr.get(model) or {}).get(f"{kind}_{attribute}")

    @property
    def trivial(self) -> bool:
        """Its gradient-boosting classifier is no more accurate than predicting the majority class."""
        acc, base = (self.tstr.get("gboost") or {}).get("accuracy"), (self.tstr.get("baseline") or {}).get(
            "majority_accuracy")
        return acc is not None and base is not None and acc <= base

    def label(self) -> str:
        return f"AIM run {self.run_dir.name} (ε = {self.epsilon:.3g}, {self.n_synthetic} synthetic rows)"


def _schema(facts: RunFacts) -> dict:
    path = facts.root / "schema_resolved.json"
    if not path.is_file():
        raise ConfigError(f"{facts.root}: no schema_resolved.json; rerun it with --fresh to report on it")
    return json.loads(path.read_text(encoding="utf-8"))


def _differences(run: RunFacts, aim: RunFacts) -> list[str]:
    mine, theirs = _schema(run), _schema(aim)
    out = []
    cols = [{c["name"] for c in s.get("columns", [])} for s in (mine, theirs)]
    if cols[0] != cols[1]:
        only = lambda a, b: ", ".join(sorted(a - b)) or "none"  # noqa: E731
        out.append(f"columns (only in this run: {only(cols[0], cols[1])}; only in the AIM run: {only(cols[1], cols[0])})")
    if mine.get("target") != theirs.get("target"):
        out.append(f"target ({mine.get('target')} vs {theirs.get('target')})")
    data = [(f.config.get("data") or {}) for f in (run, aim)]
    out += [f"data.{k} ({data[0].get(k)} vs {data[1].get(k)})" for k in TEST_ROW_KEYS if data[0].get(k) != data[1].get(k)]
    return out


def read_aim_baseline(aim_dir: str | Path, run: RunFacts) -> AimBaseline:
    """The finished AIM run at ``aim_dir``, checked against ``run`` (ConfigError, one line, on any mismatch)."""
    if not run.is_table:
        raise ConfigError(f"--baseline: an AIM baseline compares tables; {run.root} is a {run.method} run")
    aim = read_run(aim_dir)
    if aim.method != "AIM":
        raise ConfigError(f"--baseline {aim.root}: not an AIM run (its release says {aim.method}); "
                          "pass the directory `dpsynth run aim` wrote")
    if aim.root.resolve() == run.root.resolve():
        raise ConfigError(f"--baseline {aim.root}: the run itself, not a baseline")
    differences = _differences(run, aim)
    if differences:
        raise ConfigError(f"--baseline {aim.root}: not comparable with {run.root}: it differs in "
                          + "; ".join(differences) + ". Run AIM with this run's columns and data settings")
    tstr = (aim.evaluation or {}).get("tstr")
    if not tstr:
        raise ConfigError(f"--baseline {aim.root}: its evaluation has no classifier results (eval/report.json); "
                          "rerun it with --fresh")
    if not aim.ledger["private"]:
        raise ConfigError(f"--baseline {aim.root}: its ledger is marked not private; a DP baseline must be private")
    return AimBaseline(run_dir=aim.root, epsilon=float(aim.ledger["total_epsilon"]), tstr=tstr,
                       n_synthetic=(aim.evaluation or {}).get("n_synthetic"))
