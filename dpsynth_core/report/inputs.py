"""What a finished run directory already holds, read once and checked before anything is written.

A run directory that is missing, unfinished (no release yet, or its evaluation not done) or written by an
older dpsynth (its release manifest lacks the public working-set size) is refused with one line
(``ConfigError``: the CLI prints it and exits 2); the report is never half-written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from dpsynth_core.errors import ConfigError
from dpsynth_core.privacy.ledger import LEDGER_FILE, PrivacyLedger
from dpsynth_core.privacy.release_check import verify_release
from dpsynth_core.runs.release import MANIFEST_FILE, release_dir

# the release manifest's "method" -> the method's name in the report
METHODS = {"dpfairllm": "DPFairLLM", "aim": "AIM", "wasp": "WASP", "augpe": "Aug-PE", "dp-sgd lora": "train"}
EVALUATED = ("ACTG", "DPFairLLM", "AIM")  # methods with an `evaluate` stage (WASP / Aug-PE evaluate inline)


def method_name(manifest_method: str) -> str:
    if manifest_method.startswith("actg"):
        return "ACTG"
    return METHODS.get(manifest_method, manifest_method)


@dataclass
class RunFacts:
    """Everything the report reads. ``metrics`` and ``evaluation`` are owner-side (they read real rows)."""

    root: Path
    method: str
    manifest: dict
    ledger: dict
    config: dict = field(default_factory=dict)
    metrics: dict | None = None  # metrics.json
    evaluation: dict | None = None  # tables: eval/report.json
    reference: dict | None = None  # DPFairLLM: the TSTR row of classifiers trained on the real working set
    audit: dict | None = None  # audit.json next to the run, when an audit of it exists
    release_audit: dict | None = None  # audit/release_audit.json: `dpsynth audit release` of this run's config
    sweep: dict | None = None  # the DP sweep that released this run (sweep.json), when RUN_DIR is the sweep

    @property
    def is_text(self) -> bool:
        return self.method in ("ACTG", "WASP", "Aug-PE")

    @property
    def is_table(self) -> bool:
        return self.method in ("DPFairLLM", "AIM")


def _json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}); rerun the stage that writes it") from None


def resolve_run_dir(run_dir: str | Path) -> tuple[Path, dict | None]:
    """The run directory to report on: RUN_DIR itself, or the trial a DP sweep in RUN_DIR released."""
    root = Path(run_dir)
    if not root.is_dir():
        raise ConfigError(f"{root}: no such run directory")
    sweep = _json(root / "sweep.json")
    if sweep is not None and not (root / LEDGER_FILE).is_file():
        if not sweep.get("released"):
            raise ConfigError(f"{root}: this DP sweep released nothing (one of its possible outputs); no report")
        return Path(sweep["released"]), sweep
    return root, None


def read_run(run_dir: str | Path) -> RunFacts:
    root, sweep = resolve_run_dir(run_dir)
    if not (root / LEDGER_FILE).is_file():
        raise ConfigError(f"{root}: not a run directory (no {LEDGER_FILE}); pass the directory `dpsynth run` wrote")
    if not (release_dir(root) / MANIFEST_FILE).is_file():
        raise ConfigError(f"{root}: unfinished run (no release/{MANIFEST_FILE} yet); rerun `dpsynth run` to finish it")
    manifest = json.loads((release_dir(root) / MANIFEST_FILE).read_text(encoding="utf-8"))
    if "public_size" not in manifest:
        raise ConfigError(f"{root}: written by an older dpsynth (its release manifest has no public_size); "
                          "rerun it with --fresh to report on it")
    verify_release(root)  # the report states the ledger the release states, or nothing
    method = method_name(str(manifest.get("method", "")))
    if method in EVALUATED and not (root / "stages" / "evaluate.done").is_file():
        raise ConfigError(f"{root}: unfinished run (its evaluate stage has not finished); rerun `dpsynth run` "
                          "to finish it")
    config_path = root / "config.yaml"
    config = yaml.safe_load(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    reference = _json(root / "stages" / "reference.done")
    audit = _json(root / "audit.json") or _json(root / "audit" / "audit.json")
    return RunFacts(root=root, method=method, manifest=manifest, ledger=PrivacyLedger.open(root).to_dict(),
                    config=config or {}, metrics=_json(root / "metrics.json"), evaluation=_json(root / "eval" / "report.json"),
                    reference=reference, audit=audit, release_audit=_json(root / "audit" / "release_audit.json"),
                    sweep=sweep)
