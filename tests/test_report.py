"""`dpsynth report RUN_DIR` (issue 38): the owner's report rendered in headless Chromium as a person would open it,
the release's cards and exports (only DP outputs and public config), bad run directories refused whole."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli_in_process import dpsynth

SECTIONS = ("privacy", "fidelity", "utility", "fairness", "disclosure")
SENTINEL = 0.7316459213  # planted in owner-side files; must never reach release/


def _chromium() -> str:
    """Debian's chromium; `make test` installs it (scripts/ensure_chromium.sh). Missing = failure, never a skip."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    assert path, "headless Chromium is missing: `make test` installs it (scripts/ensure_chromium.sh); see its line"
    return path


def render(page: Path, out_dir: Path) -> tuple[str, str, Path]:
    """Open ``page`` in headless Chromium with the network cut: (DOM after load, console lines, screenshot)."""
    flags = [_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0",
             f"--user-data-dir={out_dir / 'chromium-profile'}", "--window-size=1200,2400"]
    shot = out_dir / f"{page.stem}.png"
    dom = subprocess.run([*flags, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=60)
    subprocess.run([*flags, f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=60)
    console = "\n".join(line for line in dom.stderr.splitlines() if "CONSOLE" in line)
    return dom.stdout, console, shot


def console_errors(console: str) -> list[str]:
    return [line for line in console.splitlines() if "ERROR" in line or "Uncaught" in line or "error" in line.lower()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_actg_run, tiny_dpfair_run):
    """The session's tiny ACTG run (tests/tiny_actg_run.py, also asserted on by tests/test_actg_pipeline.py), the
    session's tiny DPFairLLM run (tests/tiny_dpfair_run.py, also asserted on by tests/test_tabular_ledger.py) and a
    tiny AIM run on its table (configs/aim_tiny_test.yaml with the DPFairLLM run's columns and data), the
    --baseline of the fairness test. Tests copy a run before changing anything."""
    import yaml

    from dpsynth_core.tabular.aim_run import run_aim
    from dpsynth_core.tabular.config import load_aim_config

    repo = Path(__file__).resolve().parent.parent
    dpfair_run, dpfair_config, _ = tiny_dpfair_run
    table = json.loads(Path(dpfair_config).read_text())
    aim = yaml.safe_load((repo / "configs" / "aim_tiny_test.yaml").read_text())
    base = tmp_path_factory.mktemp("report_aim")
    aim.update(output_dir=str(base / "aim"), schema_path=table["schema_path"], columns=table["columns"],
               data=table["data"], evaluate_privacy=False)
    (base / "aim.yaml").write_text(yaml.safe_dump(aim))
    aim_run = run_aim(load_aim_config(base / "aim.yaml"))
    return {"actg": Path(tiny_actg_run.run), "dpfair": Path(dpfair_run), "aim": Path(aim_run)}


def _copy(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest, symlinks=True)
    return dest


def _release_bytes(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run / "release")): p.read_bytes() for p in sorted((run / "release").rglob("*"))
            if p.is_file()}


def _check_page(run: Path, tmp_path: Path, method: str) -> tuple[str, dict]:
    html_path = run / "report.html"
    assert html_path.stat().st_size <= 5 * 1024 * 1024
    html = html_path.read_text()
    # one self-contained file: nothing fetched from anywhere
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html
    dom, console, shot = render(html_path, tmp_path)
    assert not console_errors(console), console
    assert shot.is_file() and shot.read_bytes()[:4] == b"\x89PNG" and shot.stat().st_size > 20_000
    assert 'id="privacy-badge"' in dom and "unit of privacy: one record" in dom
    assert 'id="ledger-table"' in dom and 'id="grades"' in dom
    for key in SECTIONS:
        assert f'id="section-{key}"' in dom, key
    assert dom.index('id="owner-side"') < dom.index('id="privacy-badge"')  # said at the top: it reads real data
    report = json.loads((run / "report.json").read_text())
    assert report["method"] == method and report["owner_side"] is True
    return dom, report


def test_actg_report_in_chromium(runs, tmp_path, monkeypatch, capsys):
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.privacy.release_check import verify_release

    run = _copy(runs["actg"], tmp_path / "actg")
    t0 = time.perf_counter()
    code, out = dpsynth(monkeypatch, capsys, "report", str(run))
    assert code == 0, out
    assert time.perf_counter() - t0 <= 30
    dom, report = _check_page(run, tmp_path, "ACTG")
    ledger = PrivacyLedger.open(run)
    badge = report["privacy_badge"]
    assert badge["epsilon"] == pytest.approx(ledger.total_epsilon()) and badge["delta"] == ledger.delta
    assert badge["public_size"] == 32 and badge["m_times_delta"] == pytest.approx(32 * ledger.delta)
    ledger_rows = report["sections"]["privacy"]["tables"][0]["rows"]
    assert [r[1] for r in ledger_rows] == [e.stage for e in ledger.entries()]
    assert "Adding or removing any single record" in report["sections"]["privacy"]["notes"][0]
    # 2 synthetic texts, 16 real: MAUVE is "not enough texts", never a number (report and metrics.json)
    fidelity = report["sections"]["fidelity"]
    assert fidelity["figures"][0]["value"].startswith("not enough texts")
    assert json.loads((run / "metrics.json").read_text())["mauve"]["status"] == "not enough texts"
    assert "not enough texts" in dom
    # every utility figure beside its baseline on the same metric, with its sample size
    for f in report["sections"]["utility"]["figures"]:
        assert f["baseline"] is not None and f["n"].startswith("trained on")
    assert report["sections"]["fairness"]["grade"] == "not applicable"
    # release/: cards and exports, listed in the manifest and verified against the ledger
    manifest = verify_release(run)
    assert {"README.md", "MODEL_CARD.md", "synthetic.parquet"} <= set(manifest["files"])
    card = (run / "release" / "README.md").read_text()
    assert card.startswith("---\n") and "differential-privacy" in card and f"ε = {ledger.total_epsilon():.4f}" in card
    from datasets import load_from_disk

    synthetic = [json.loads(line) for line in (run / "release" / "synthetic.jsonl").read_text().splitlines()]
    assert list(load_from_disk(str(run / "release" / "hf_dataset"))["text"]) == [r["text"] for r in synthetic]


def test_dpfair_report_in_chromium_with_fairness_and_baselines(runs, tmp_path, monkeypatch, capsys):
    run = _copy(runs["dpfair"], tmp_path / "dpfair")
    code, out = dpsynth(monkeypatch, capsys, "report", str(run))
    assert code == 0, out
    dom, report = _check_page(run, tmp_path, "DPFairLLM")
    fair = report["sections"]["fairness"]
    assert {r[0] for r in fair["tables"][0]["rows"]} == {"race", "sex"}
    evaluation_gb = json.loads((run / "eval" / "report.json").read_text())["tstr"]
    trivial = evaluation_gb["gboost"]["accuracy"] <= evaluation_gb["baseline"]["majority_accuracy"]
    assert fair["grade"] == "not graded" if trivial else fair["grade"] in "ABCD"  # no grade for a one-class model
    util = report["sections"]["utility"]
    evaluation = json.loads((run / "eval" / "report.json").read_text())
    base = evaluation["tstr"]["baseline"]
    acc = next(f for f in util["figures"] if f["label"] == "TSTR accuracy (gboost)")
    assert acc["baseline"] == base["majority_accuracy"] and acc["value"] == evaluation["tstr"]["gboost"]["accuracy"]
    assert f"tested on {base['n_test']} real rows" in acc["n"]
    assert bool(acc["flag"]) == (acc["value"] <= acc["baseline"])  # flagged exactly when no better
    assert report["sections"]["disclosure"]["grade"] in "ABCD"
    assert report["sections"]["fidelity"]["grade"] in "ABCD"
    assert "synthetic.parquet" in json.loads((run / "release" / "MANIFEST.json").read_text())["files"]


def test_console_errors_are_caught(tmp_path):
    """The check above can fail: a page that logs an error is caught."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>console.error('boom'); undefinedFunction();</script></body></html>")
    _, console, _ = render(page, tmp_path)
    assert console_errors(console)


def test_release_holds_no_owner_side_figure(runs, tmp_path):
    """Sentinel values planted in metrics.json and the owner-side evaluation appear in the report (it reads them)
    and nowhere in release/, cards and exports included."""
    from dpsynth_core.report import write_report

    run = _copy(runs["dpfair"], tmp_path / "sentinel")
    metrics = json.loads((run / "metrics.json").read_text())
    metrics.update(acc_lr=SENTINEL, tvd_1way=SENTINEL)
    (run / "metrics.json").write_text(json.dumps(metrics))
    evaluation = json.loads((run / "eval" / "report.json").read_text())
    evaluation["fidelity"]["tvd_1way_mean"] = SENTINEL
    evaluation["privacy"]["mia_auc"] = SENTINEL
    (run / "eval" / "report.json").write_text(json.dumps(evaluation))
    write_report(run)
    assert "0.732" in (run / "report.html").read_text()  # the report did read the planted values
    needles = [repr(SENTINEL).encode(), b"0.7316459", b"0.732"]
    for name, data in _release_bytes(run).items():
        assert not any(n in data for n in needles), name


def _hashes(run: Path) -> dict[str, str]:
    return {k: hashlib.sha256(v).hexdigest() for k, v in _release_bytes(run).items()}


@pytest.mark.parametrize("case", ["missing", "unfinished", "older", "evaluation_unfinished"])
def test_bad_run_dirs_give_one_line_and_exit_2(runs, tmp_path, monkeypatch, capsys, case):
    run = tmp_path / "run"
    if case != "missing":
        _copy(runs["dpfair"], run)
    if case == "unfinished":
        shutil.rmtree(run / "release")
    if case == "older":
        manifest = json.loads((run / "release" / "MANIFEST.json").read_text())
        del manifest["public_size"]
        (run / "release" / "MANIFEST.json").write_text(json.dumps(manifest))
    if case == "evaluation_unfinished":
        (run / "stages" / "evaluate.done").unlink()
    before = _hashes(run) if (run / "release").is_dir() else {}
    code, out = dpsynth(monkeypatch, capsys, "report", str(run))
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert {"missing": "no such run directory", "unfinished": "unfinished run", "older": "older dpsynth",
            "evaluation_unfinished": "unfinished run"}[case] in out
    assert not (run / "report.html").exists() and not (run / "report.json").exists()
    assert (_hashes(run) if (run / "release").is_dir() else {}) == before


def test_train_run_shows_fidelity_and_utility_not_applicable(runs, tmp_path):
    """A `dpsynth train`-shaped run (an adapter and a ledger, no synthetic data): a model card, no dataset card."""
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.report import write_report
    from dpsynth_core.runs.release import write_release

    run = tmp_path / "train"
    run.mkdir()
    shutil.copy2(runs["actg"] / "ledger.sqlite", run / "ledger.sqlite")
    write_release(run, {"adapter": runs["actg"] / "generator" / "adapter"}, ledger=PrivacyLedger.open(run),
                  method="dp-sgd lora")
    write_report(run)
    report = json.loads((run / "report.json").read_text())
    assert report["method"] == "train"
    for key in ("fidelity", "utility", "fairness", "disclosure"):
        assert report["sections"][key]["grade"] == "not applicable", key
    assert (run / "release" / "MODEL_CARD.md").is_file() and not (run / "release" / "README.md").exists()
    assert "not applicable" in (run / "report.html").read_text()


def test_dp_sweep_report_states_the_selection_epsilon(runs, tmp_path):
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.privacy.events import SelectionEvent
    from dpsynth_core.report import write_report
    from dpsynth_core.tuning.plan import SweepBound
    from dpsynth_core.tuning.release import release_best

    sweep = tmp_path / "sweep"
    best = _copy(runs["actg"], sweep / "trials" / "best")
    trial = PrivacyLedger.open(best)
    spent = tuple(e.event() for e in trial.entries() if e.kind != "post_processing")
    event = SelectionEvent(candidates=(spent,), mean_trials=2.0)
    bound = SweepBound(event=event, epsilon=event.epsilon(trial.delta), delta=trial.delta, dataset=trial.dataset,
                       planned_points=1)
    total = release_best(best, [best], bound, budget=50.0)
    (sweep / "sweep.json").write_text(json.dumps({"pipeline": "actg", "released": str(best)}))
    write_report(sweep)  # the sweep's directory: the report of the trial it released
    report = json.loads((best / "report.json").read_text())
    assert report["privacy_badge"]["selection"] is True
    assert report["privacy_badge"]["epsilon"] == pytest.approx(total) == pytest.approx(bound.epsilon)
    assert report["sections"]["privacy"]["tables"][0]["rows"][0][1] == "hyperparameter_selection"
    assert any(f"Selection ε of the DP sweep: {total:.4f}" in n for n in report["sections"]["privacy"]["notes"])
    assert "ε of the DP sweep" in (best / "report.html").read_text()


def test_fairness_shows_the_aim_baseline_beside_the_run(runs, tmp_path, monkeypatch, capsys):
    """`dpsynth report RUN --baseline AIM_RUN`: AIM's DP / EO gaps (its synthetic table, the same classifiers, the same
    real test rows) in their own columns of report.json and report.html; a baseline that does not fit is refused."""
    aim_run = runs["aim"]
    run = _copy(runs["dpfair"], tmp_path / "dpfair")
    code, out = dpsynth(monkeypatch, capsys, "report", str(run), "--baseline", str(aim_run))
    assert code == 0, out
    report = json.loads((run / "report.json").read_text())
    table = report["sections"]["fairness"]["tables"][0]
    assert table["columns"] == ["attribute", "classifier", "DP gap (synthetic)", "DP gap (real)", "DP gap (AIM)",
                                "EO gap (synthetic)", "EO gap (real)", "EO gap (AIM)"]
    aim_tstr = json.loads((aim_run / "eval" / "report.json").read_text())["tstr"]
    mine = json.loads((run / "eval" / "report.json").read_text())["tstr"]
    assert aim_tstr["baseline"]["n_test"] == mine["baseline"]["n_test"] == 300  # the same test rows
    from dpsynth_core.report.model import fmt

    for attribute, model, dp_syn, _, dp_aim, eo_syn, _, eo_aim in table["rows"]:
        assert (dp_syn, eo_syn) == (fmt(mine[model][f"dp_diff_{attribute}"]), fmt(mine[model][f"eo_diff_{attribute}"]))
        assert (dp_aim, eo_aim) == (fmt(aim_tstr[model][f"dp_diff_{attribute}"]),
                                    fmt(aim_tstr[model][f"eo_diff_{attribute}"]))
    assert {r[0] for r in table["rows"]} == {"race", "sex"}
    assert report["baselines"]["aim"]["run_dir"] == str(aim_run)
    assert any(n.startswith("AIM baseline: AIM run") for n in report["sections"]["fairness"]["notes"])
    html = (run / "report.html").read_text()
    fairness_html = html[html.index('id="section-fairness"'):html.index('id="section-disclosure"')]
    assert "<th>DP gap (AIM)</th>" in fairness_html and "<th>EO gap (AIM)</th>" in fairness_html

    # refused whole, with one line: not an AIM run; an AIM run on other test rows
    other = _copy(aim_run, tmp_path / "aim_other_test_rows")
    config = (other / "config.yaml").read_text()
    (other / "config.yaml").write_text(config.replace("test_rows: 300", "test_rows: 500"))
    assert "test_rows: 500" in (other / "config.yaml").read_text()
    for baseline, why in ((runs["dpfair"], "not an AIM run"), (other, "data.test_rows (300 vs 500)")):
        fresh = _copy(runs["dpfair"], tmp_path / f"refused_{Path(baseline).name}")
        before = _hashes(fresh)
        code, out = dpsynth(monkeypatch, capsys, "report", str(fresh), "--baseline", str(baseline))
        assert code == 2 and len(out.strip().splitlines()) == 1 and why in out, out
        assert not (fresh / "report.json").exists() and _hashes(fresh) == before
