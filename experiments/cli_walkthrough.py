"""Issue 19's walk-through: every bad input and odd sequence a new user tried, replayed.

    .venv/bin/python experiments/cli_walkthrough.py [--quick] [--out walk.md]

Runs the installed ``dpsynth`` in a scratch directory (a copy of ``configs/``; the real data from
``$DPSYNTH_DATA_DIR`` or ``../shared/data``) and prints one row per case: the command, its exit
code, the first line of its message, what it left on disk, and whether that is what a user should
get (``expect``). ``--quick`` skips the cases that need a finished run (a few minutes on 2 cores).
The data files made here are synthetic; no private value is printed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
DPSYNTH = str(Path(sys.executable).parent / "dpsynth")


@dataclass
class Case:
    name: str
    args: list[str]
    expect_rc: int | tuple[int, ...]
    expect_text: str = ""          # must appear in the output (case-insensitive)
    left: str | None = None        # a path that must NOT exist afterwards
    max_seconds: float | None = None


def first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("WARNING", "warning:")):
            return line[:110]
    return ""


def run(args: list[str], cwd: Path, timeout: float = 900) -> tuple[int, str, float]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("DPSYNTH_VERBOSE", None)
    start = time.monotonic()
    p = subprocess.run([DPSYNTH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return p.returncode, (p.stderr + "\n" + p.stdout), time.monotonic() - start


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def setup(work: Path) -> dict[str, Path]:
    shutil.copytree(REPO / "configs", work / "configs")
    cfg = lambda name: yaml.safe_load((REPO / "configs" / name).read_text())  # noqa: E731
    bad_csv = work / "bad.csv"
    rows = ["abstract,category"] + [f"text number {i} about cells,neuroscience" for i in range(40)]
    rows[18] = '"",neuroscience'                   # data row 18 (1-based, after the header): empty text
    bad_csv.write_text("\n".join(rows) + "\n")
    actg = cfg("actg_tiny.yaml")
    actg["output_dir"] = str(work / "runs" / "actg_bad")
    actg["data"] = {**actg.get("data", {}), "path": str(bad_csv), "text_col": "abstract", "label_col": "category"}
    paths = {"actg_bad": write_yaml(work / "actg_bad.yaml", actg)}
    (work / "empty.yaml").write_text("# nothing here\n")
    paths["empty"] = work / "empty.yaml"
    dpfair = cfg("dpfair_tiny_test.yaml")
    dpfair["output_dir"] = str(work / "runs" / "dpfair_delta")
    dpfair["delta"] = 1.0
    paths["dpfair_delta"] = write_yaml(work / "dpfair_delta.yaml", dpfair)
    wasp = cfg("wasp_tiny.yaml")
    wasp["output_dir"] = str(work / "runs" / "wasp_delta")
    wasp["delta"] = 1.5
    paths["wasp_delta"] = write_yaml(work / "wasp_delta.yaml", wasp)
    big = cfg("actg_tiny.yaml")
    big["output_dir"] = str(work / "runs" / "actg_big")
    big["best_of_n"] = {"n": 100000}
    paths["actg_big"] = write_yaml(work / "actg_big.yaml", big)
    aim = cfg("aim_tiny_test.yaml")
    aim["output_dir"] = str(work / "runs" / "aim" / "aim_tiny")
    paths["aim"] = write_yaml(work / "aim.yaml", aim)
    paths["aim_eps1"] = write_yaml(work / "aim_eps1.yaml", {**aim, "privacy": {**aim["privacy"], "epsilon": 1.0}})
    train = cfg("train_tiny.yaml")
    train["output_dir"] = str(work / "runs" / "train")
    paths["train"] = write_yaml(work / "train.yaml", train)
    paths["train_eps1"] = write_yaml(work / "train_eps1.yaml", {**train, "privacy": {**train["privacy"], "epsilon": 1.0}})
    # eval tabular: a real-test file with a bad value in one row
    adult_test = work / "adult_bad_test.csv"
    header = "age,education,sex,hours_per_week,income"
    lines = [header] + [f"{30 + i % 20},Bachelors,Male,40,<=50K" for i in range(40)]
    lines[17] = "thirty,Bachelors,Male,40,<=50K"   # data row 17 (1-based, after the header), as data check counts
    adult_test.write_text("\n".join(lines) + "\n")
    paths["adult_bad_test"] = adult_test
    return paths


def cases(work: Path, p: dict[str, Path], quick: bool) -> list[Case]:
    out = [
        Case("usage: unknown option", ["run", "actg", "--bogus"], 2, "no such option"),
        Case("usage: unknown command", ["frobnicate"], 2, "no such command"),
        Case("usage: missing argument", ["release"], 2, "missing argument"),
        Case("usage: bad type", ["privacy", "epsilon", "-q", "abc", "-s", "1", "-T", "10"], 2, "invalid value"),
        Case("--version", ["--version"], 0, "dpsynth"),
        Case("bare dpsynth", [], 2, "usage"),
        Case("ACTG, bad data file (empty text on data row 18)", ["run", "actg", "--config", str(p["actg_bad"])], 2,
             "row 18", left=str(work / "runs" / "actg_bad")),
        Case("empty config file", ["run", "actg", "--config", str(p["empty"])], 2, "empty", left=str(work / "runs" / "actg_tiny")),
        Case("DPFairLLM, delta = 1", ["run", "dpfair", "--config", str(p["dpfair_delta"])], 2, "delta",
             left=str(work / "runs" / "dpfair_delta")),
        Case("WASP, delta = 1.5", ["run", "wasp", "--config", str(p["wasp_delta"])], 2, "delta",
             left=str(work / "runs" / "wasp_delta")),
        Case("ACTG, best_of_n.n = 100000", ["run", "actg", "--config", str(p["actg_big"])], 2, "best_of_n.n",
             left=str(work / "runs" / "actg_big")),
        Case("--check (ACTG bad data)", ["run", "actg", "--config", str(p["actg_bad"]), "--check"], 2, "row 18",
             left=str(work / "runs" / "actg_bad")),
        Case("privacy calibrate --epsilon 1e6", ["privacy", "calibrate", "--epsilon", "1e6", "--delta", "1e-5",
                                                 "--sampling-rate", "0.01", "--steps", "1000"], (0, 2), "",
             max_seconds=60),
        Case("privacy epsilon, sigma = 0.02", ["privacy", "epsilon", "-q", "0.01", "-s", "0.02", "-T", "1000",
                                               "--delta", "1e-5"], (0, 2), "", max_seconds=60),
        Case("run actg --help has an example", ["run", "actg", "--help"], 0, "example"),
    ]
    if not quick:
        out += [
            Case("AIM run (tiny), first time", ["run", "aim", "--config", str(p["aim"])], 0, "epsilon"),
            Case("AIM rerun, finished", ["run", "aim", "--config", str(p["aim"])], 0, "already"),
            Case("AIM rerun with epsilon 4 -> 1", ["run", "aim", "--config", str(p["aim_eps1"])], 2, "epsilon"),
            Case("eval tabular, bad value on data row 17", ["eval", "tabular", "--run", str(work / "runs" / "aim" / "aim_tiny"),
                                                            "--real-train", str(p["adult_bad_test"]),
                                                            "--real-test", str(p["adult_bad_test"])], 2, "row 17"),
            Case("train (tiny), first time", ["train", "--config", str(p["train"])], 0, ""),
            Case("train rerun, finished", ["train", "--config", str(p["train"])], 0, "already"),
            Case("train rerun with epsilon 2 -> 1", ["train", "--config", str(p["train_eps1"])], 2, "epsilon"),
        ]
    return out


def lock_case(work: Path, p: dict[str, Path]) -> tuple[str, int, str, str, bool]:
    """Two processes on one run directory: the second is refused while the first holds the lock."""
    cfg = yaml.safe_load(p["aim"].read_text())
    cfg["output_dir"] = str(work / "runs" / "aim_lock")
    path = write_yaml(work / "aim_lock.yaml", cfg)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    first = subprocess.Popen([DPSYNTH, "run", "aim", "--config", str(path)], cwd=work, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300  # the run dir is output_dir: wait for its lock file
    while (not list((work / "runs" / "aim_lock").glob("**/.lock")) and first.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.2)
    rc, text, _ = run(["run", "aim", "--config", str(path)], work)
    first.wait(timeout=900)
    ok = rc != 0 and "lock" in text.lower()
    return "second process on a running run dir", rc, first_line(text), "first run finished normally" if first.returncode == 0 else f"first rc {first.returncode}", ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the cases that need finished runs")
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="dpsynth-walk-"))
    paths = setup(work)
    rows = ["| case | command | exit | first line | left on disk | as expected |", "|---|---|---|---|---|---|"]
    failures = 0
    for case in cases(work, paths, args.quick):
        rc, text, seconds = run(case.args, work)
        expected_rc = case.expect_rc if isinstance(case.expect_rc, tuple) else (case.expect_rc,)
        left = "nothing" if case.left is None or not Path(case.left).exists() else f"{Path(case.left).name}/ exists"
        ok = (rc in expected_rc and case.expect_text.lower() in text.lower() and left == "nothing"
              and (case.max_seconds is None or seconds <= case.max_seconds))
        failures += not ok
        cmd = "dpsynth " + " ".join(a if not a.startswith(str(work)) else Path(a).name for a in case.args)
        rows.append(f"| {case.name} | `{cmd}` | {rc} | {first_line(text).replace('|', '/')} | {left} "
                    f"({seconds:.0f} s) | {'yes' if ok else 'NO'} |")
        print(rows[-1], flush=True)
    if not args.quick:
        name, rc, line, left, ok = lock_case(work, paths)
        failures += not ok
        rows.append(f"| {name} | `dpsynth run aim` ×2 | {rc} | {line.replace('|', '/')} | {left} | {'yes' if ok else 'NO'} |")
        print(rows[-1], flush=True)
    table = "\n".join(rows)
    if args.out:
        args.out.write_text(table + "\n")
    print(f"\n{len(rows) - 2 - failures} of {len(rows) - 2} cases as expected; scratch dir {work}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
