"""Release audits of the methods (``dpsynth audit release``): each method's ``ReleaseTarget``.

    from dpsynth.api.audit import release_target
    from dpsynth_core.audit.release_run import run_release_audit
    result = run_release_audit(release_target("aim", "configs/audit_release_aim.yaml"), settings, Path("runs/a"))

A target runs the config's own stages (``runs.contract``) through the one loop (``run_loop``) on the
audit's file, with the whole file as the working set and an own run directory and ledger. The two
test-only modes change the audit run, never the user's config file: ``dp_off`` runs the method's DP
mechanisms with their noise switched off, ``broken_release`` adds a stage that copies 10 % of the private working set
into the released output. Both mark the audit run's ledger "not private" before any private read.
The owner-side report stages (``after_release``) are left out: they release nothing. ACTG, DPFairLLM and
the PE methods take their own epsilon = inf reference run (``not_private: true``) as ``dp_off``: every DP
mechanism of the pipeline without noise or clipping, the ledger marked by the run loop.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from dpsynth_core.audit.release_canaries import TableCanaries, TableColumn, TextCanaries
from dpsynth_core.audit.release_run import AuditRunOutcome, ReleaseTarget
from dpsynth_core.audit.release_settings import LEAK_FRACTION, ReleaseAuditSettings
from dpsynth_core.errors import ConfigError
from dpsynth_core.runs.contract import Method, Stage

AUDIT_RECORDS = "owner_only/audit_records"  # the audit run's private file (mode 0600), deleted with the run
NOISE_OFF_RHO = 1e5  # dp_off: AIM's Gaussian noise at this zCDP rho is ~0.01 of a count (sigma = sqrt(T / 1.8 rho)): none in effect
TEST_ONLY_REASON = "test-only audit mode '{mode}': {what} (dpsynth audit release --allow-test-only)"


def _owner_only_file(root: Path, suffix: str) -> Path:
    path = Path(root) / f"{AUDIT_RECORDS}{suffix}"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    return path


def _write_private(path: Path, write) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
        write(handle)


class _NoLedger:
    """dp_off: AIM measures without recording (the run's ledger is marked not private instead)."""

    def __init__(self, delta: float) -> None:
        self.delta = delta

    def check(self, stage, event) -> float:
        return 0.0

    def record(self, stage, event, details=None) -> float:
        return 0.0


def _mark_test_only(root: str, stage: str, mode: str, what: str) -> None:
    from dpsynth_core.privacy import PrivacyLedger

    PrivacyLedger.open(root).mark_not_private(stage, TEST_ONLY_REASON.format(mode=mode, what=what))


def _aim_noise_off(cfg, root: str) -> dict:
    """AIM's stage with its measurement and selection noise off (test-only)."""
    from dpsynth_core.tabular import private_data
    from dpsynth_core.tabular.baseline import aim_synthesize
    from dpsynth_core.tabular.run_schema import resolved_schema
    from dpsynth_core.privacy import PrivacyLedger
    from dpsynth_core.runs.files import atomic_write_text

    _mark_test_only(root, "aim", "dp_off", "AIM ran without noise; epsilon = inf")
    run = Path(root)
    schema = resolved_schema(run)
    private = private_data.load_private(cfg, run, schema)
    synth = aim_synthesize(private, schema, epsilon=cfg.epsilon, ledger=_NoLedger(PrivacyLedger.open(run).delta),
                           num_rows=cfg.num_rows, bins=cfg.bins, seed=cfg.sample_seed, rho=NOISE_OFF_RHO)
    atomic_write_text(run / "synthetic.csv", synth.to_csv(index=False))
    return {"rows": len(synth)}


def _copy_private_rows(cfg, root: str) -> dict:
    """The broken release: 10 % of the private working set appended to the synthetic table (test-only)."""
    from dpsynth_core.privacy.randomness import secure_rng
    from dpsynth_core.runs.files import atomic_write_text
    from dpsynth_core.tabular import private_data
    from dpsynth_core.tabular.run_schema import resolved_schema

    _mark_test_only(root, "broken_release", "broken_release", "10 % of the private rows copied into the release")
    run = Path(root)
    private = private_data.load_private(cfg, run, resolved_schema(run))
    rng = secure_rng()
    copied = private.iloc[rng.choice(len(private), size=int(round(LEAK_FRACTION * len(private))), replace=False)]
    synth = pd.read_csv(run / "synthetic.csv", keep_default_na=False)
    out = pd.concat([synth, copied[synth.columns]], ignore_index=True)
    atomic_write_text(run / "synthetic.csv", out.iloc[rng.permutation(len(out))].to_csv(index=False))
    return {"rows": len(out)}


def audit_stages(stages: list[Stage], mode: str, dp_stage: str, noise_off, leak) -> list[Stage]:
    """The method's stages for an audit run: report stages dropped; ``mode`` applied."""
    out = []
    for stage in stages:
        if stage.after_release:
            continue
        if mode == "dp_off" and stage.name == dp_stage:
            stage = Stage(stage.name, noise_off, reads_private=True)
        out.append(stage)
    if mode == "broken_release":
        out.append(Stage("broken_release", leak, reads_private=True))
    return out


class AimTarget(ReleaseTarget):
    """AIM (``dpsynth run aim``): a table; its DP stage is ``aim``."""

    method = "aim"

    def __init__(self, config) -> None:
        from dpsynth_core.tabular.schema import load_schema

        self.config = config
        self.schema = load_schema(config.schema_path).select(config.columns)

    @property
    def claimed_epsilon(self) -> float:
        return float(self.config.epsilon)

    def design(self, settings: ReleaseAuditSettings) -> TableCanaries:
        columns = []
        for c in self.schema.columns:
            if c.is_categorical:
                columns.append(TableColumn(c.name, tuple(c.categories or c.candidate_categories or ())))
            else:
                low, high = (c.min, c.max) if c.domain == "public" else (c.candidate_min, c.candidate_max)
                columns.append(TableColumn(c.name, None, float(low), float(high), c.type == "integer"))
        return TableCanaries(columns)

    def private_records(self) -> pd.DataFrame:
        """One draw of the config's working set (its public rate, from OS entropy), audited columns only."""
        from dpsynth_core.privacy.randomness import working_set
        from dpsynth_core.tabular import private_data

        cfg = self.config
        frame = private_data.read_source(cfg)
        keep = working_set(len(frame), cfg.data.train_rows or len(frame), cfg.data.sample_fraction,
                           public_corpus=cfg.data.source == "adult", field="data.n_records")
        return self.schema.validate_frame(frame.iloc[keep], private_data.source_name(cfg))[self.schema.names]

    def _audit_config(self, data_file: Path, public_size: int, root: Path):
        raw = self.config.model_dump(mode="json", by_alias=True)
        raw.update(name="run", output_dir=str(root / "run"), evaluate_privacy=False)
        raw["data"] = {"source": str(data_file), "test_path": str(data_file), "n_records": public_size,
                       "sample_fraction": 1.0, "seed": self.config.data.seed}
        return type(self.config).model_validate(raw)

    def run(self, records: pd.DataFrame, public_size: int, root: Path, mode: str) -> AuditRunOutcome:
        from dpsynth_core.run_loop import run_method
        from dpsynth_core.tabular.aim_run import AimMethod

        data_file = _owner_only_file(root, ".csv")
        _write_private(data_file, lambda h: records.to_csv(h, index=False))
        cfg = self._audit_config(data_file, public_size, root)
        method = _AuditMethod(AimMethod(cfg), mode, "aim", _aim_noise_off, _copy_private_rows)
        return _outcome(run_method(method, resume=False))

    def released_records(self, release_dir: Path) -> pd.DataFrame:
        return pd.read_csv(Path(release_dir) / "synthetic.csv", keep_default_na=False)

    def audited_run_dir(self) -> Path | None:
        return _same_config_run(self.config.run_dir(), self.config)


class _AuditMethod(Method):
    """A method's own stages for one audit run (``audit_stages``); everything else delegated."""

    def __init__(self, inner: Method, mode: str, dp_stage: str, noise_off, leak) -> None:
        super().__init__(inner.config)
        self.inner, self.mode, self.dp_stage, self.noise_off, self.leak = inner, mode, dp_stage, noise_off, leak
        self.kind = inner.kind

    def stages(self) -> list[Stage]:
        return audit_stages(self.inner.stages(), self.mode, self.dp_stage, self.noise_off, self.leak)

    def run_dir(self) -> Path:
        return self.inner.run_dir()

    def privacy_plan(self):
        return self.inner.privacy_plan()

    def release_items(self, root: Path):
        return self.inner.release_items(root)

    def ledger_dir(self, root: Path) -> Path:
        return self.inner.ledger_dir(root)

    def release_name(self) -> str:
        return f"{self.inner.release_name()} (audit run)"


def _same_config_run(root: Path, config) -> Path | None:
    from dpsynth_core.runs import refuse_changed_config

    try:
        return Path(root) if refuse_changed_config(Path(root), config.model_dump(mode="json")) else None
    except ConfigError:  # a run of another config: the audit is not about it
        return None


def _outcome(result) -> AuditRunOutcome:
    ledger = result.ledger
    return AuditRunOutcome(result.release_dir, ledger.delta,
                           ledger.total_epsilon() if ledger.is_private else float("inf"), ledger.is_private)


class PETarget(ReleaseTarget):
    """WASP / Aug-PE: labelled texts; the PLMs run in this process (``backend: hf``: where, not what)."""

    def __init__(self, config) -> None:
        self.config = config
        self.method = config.method

    @property
    def claimed_epsilon(self) -> float:
        return float(self.config.epsilon)

    def design(self, settings: ReleaseAuditSettings) -> TextCanaries:
        return TextCanaries(settings.canary_words, labels=tuple(self.config.data.classes or ()))

    def private_records(self) -> pd.DataFrame:
        """One draw of the config's working set (its public rate, from OS entropy)."""
        from dpsynth_core.pe.data_split import split_data

        private = split_data(self.config)[0]
        return pd.DataFrame({"text": private.texts, "label": private.labels})

    def _audit_config(self, data_file: Path, public_size: int, root: Path, mode: str):
        raw = self.config.model_dump(mode="json", by_alias=True)
        raw.update(output_dir=str(root / "run"), evaluate=False)
        raw["data"] = {**raw["data"], "source": "file", "path": str(data_file), "text_col": "text",
                       "label_col": "label", "n_records": public_size, "sample_fraction": 1.0, "num_test": 0}
        raw["plms"] = [{**plm, "backend": "hf"} for plm in raw["plms"]]
        if mode == "dp_off":  # the method's own noiseless reference run: ledger marked not private
            raw.update(privacy={**raw.get("privacy", {}), "epsilon": float("inf")}, not_private=True)
        return type(self.config).model_validate(raw)

    def run(self, records: pd.DataFrame, public_size: int, root: Path, mode: str) -> AuditRunOutcome:
        from dpsynth_core.pe.pipeline import PEMethod
        from dpsynth_core.run_loop import run_method
        from ray_jobs.pe_backends import make_llms

        data_file = _owner_only_file(root, ".csv")
        _write_private(data_file, lambda h: records.to_csv(h, index=False))
        cfg = self._audit_config(data_file, public_size, root, mode)
        inner = PEMethod(cfg, make_llms)
        method = _AuditMethod(inner, "broken_release" if mode == "broken_release" else "dp", cfg.method, None,
                              _copy_private_texts)
        return _outcome(run_method(method, resume=False))

    def released_records(self, release_dir: Path) -> list[str]:
        lines = (Path(release_dir) / "synthetic.jsonl").read_text(encoding="utf-8").splitlines()
        return [json.loads(line)["text"] for line in lines if line.strip()]

    def audited_run_dir(self) -> Path | None:
        return _same_config_run(Path(self.config.run_dir), self.config)


def _copy_private_texts(cfg, root: str) -> dict:
    """The broken release of a PE method: 10 % of the private texts appended to synthetic.jsonl (test-only)."""
    from dpsynth_core.pe.data_split import split_data

    private = split_data(cfg)[0]
    return _append_copies(root, private.texts,
                          lambda i: {"label": private.labels[i], "plm": "copied", "iteration": -1})


def _copy_actg_texts(cfg, root: str) -> dict:
    """ACTG's broken release: 10 % of the private working set's texts appended to synthetic.jsonl (test-only)."""
    from dpsynth_core.actg.data_split import load_private_split

    texts = load_private_split(cfg).private[cfg.data.text_col].astype(str).tolist()
    return _append_copies(root, texts, lambda i: {"pool": "copied"})


def _append_copies(root: str, texts: list[str], fields) -> dict:
    from dpsynth_core.privacy.randomness import secure_rng
    from dpsynth_core.runs.files import atomic_write_text

    _mark_test_only(root, "broken_release", "broken_release", "10 % of the private texts copied into the release")
    rng = secure_rng()
    picked = rng.choice(len(texts), size=int(round(LEAK_FRACTION * len(texts))), replace=False)
    path = Path(root) / "synthetic.jsonl"
    rows = path.read_text(encoding="utf-8").splitlines()
    rows += [json.dumps({"text": texts[i], **fields(i)}) for i in picked]
    atomic_write_text(path, "\n".join(rows[i] for i in rng.permutation(len(rows))) + "\n")
    return {"rows": len(rows)}


class ActgTarget(ReleaseTarget):
    """ACTG-ARL (``dpsynth run actg``): its stage list on the audit's file of texts; ``dp_off`` is the config's
    own epsilon = inf reference run (features resampled without AIM noise, LoRA without noise or clipping).

    ACTG holds out ``data.n_eval`` evaluation rows by a public content key before the working set is drawn.
    The audit file keeps the config's held-out rows, which have the smallest keys, and a canary whose key
    would fall among them is redrawn, so the holdout takes exactly those rows and every included canary
    reaches the mechanism."""

    method = "actg"

    def __init__(self, config) -> None:
        reward = config.reward or config.extractor
        if config.mode != "actg" or config.extractor.kind == "columns" or reward.kind == "columns":
            raise ConfigError("release audits of ACTG cover mode: actg with a text extractor (a canary text has "
                              "no attribute columns): set extractor.kind to embedding or supervised")
        self.config = config
        self._held_out: list[str] | None = None
        self._held_key_max: int | None = None

    @property
    def claimed_epsilon(self) -> float:
        return float(self.config.privacy.epsilon)

    def design(self, settings: ReleaseAuditSettings) -> TextCanaries:
        return TextCanaries(settings.canary_words, keep=self._outside_holdout)

    def _outside_holdout(self, text: str) -> bool:
        from dpsynth_core.privacy.randomness import content_rank_keys

        if self._held_key_max is None:
            raise RuntimeError("ActgTarget.private_records() sets the holdout before canaries are drawn")
        return int(content_rank_keys([text], self.config.data.seed)[0]) > self._held_key_max

    def private_records(self) -> list[str]:
        """One draw of the config's working set (its public rate, from OS entropy); its held-out rows kept aside."""
        from dpsynth_core.actg.data_split import load_private_split
        from dpsynth_core.privacy.randomness import content_rank_keys

        split, col = load_private_split(self.config), self.config.data.text_col
        self._held_out = split.held_out[col].astype(str).tolist()
        self._held_key_max = int(content_rank_keys(self._held_out, self.config.data.seed).max())
        return split.private[col].astype(str).tolist()

    def audit_method(self, data_file: Path, public_size: int, root: Path, mode: str) -> Method:
        """The config's stages for one audit run on ``data_file`` (``mode`` applied; nothing run)."""
        from dpsynth_core.actg.pipeline import ActgMethod

        raw = self.config.model_dump(mode="json", by_alias=True)
        raw.update(name="run", output_dir=str(root / "run"), stop_after_stage=None)
        raw["data"] = {**raw["data"], "path": str(data_file), "text_col": "text", "label_col": None,
                       "n_records": public_size, "sample_fraction": 1.0}
        if mode == "dp_off":  # the method's own noiseless reference run: ledger marked not private
            raw.update(privacy={**raw["privacy"], "epsilon": float("inf")}, not_private=True)
        cfg = type(self.config).model_validate(raw)
        return _AuditMethod(ActgMethod(cfg), "broken_release" if mode == "broken_release" else "dp", "private",
                            None, _copy_actg_texts)

    def write_audit_file(self, records: list[str], root: Path) -> Path:
        """The audit run's private file: records, included canaries and the config's held-out rows (mode 0600)."""
        from dpsynth_core.privacy.randomness import content_keyed_holdout

        texts = list(records) + list(self._held_out or ())
        held = {texts[i] for i in content_keyed_holdout(texts, self.config.data.n_eval, self.config.data.seed)}
        if held != set(self._held_out or ()):  # the canaries' keep test makes this impossible; never dilute silently
            raise RuntimeError("the audit file's holdout would take records or canaries out of the working set")
        data_file = _owner_only_file(root, ".csv")
        _write_private(data_file, lambda h: pd.DataFrame({"text": texts}).to_csv(h, index=False))
        return data_file

    def run(self, records: list[str], public_size: int, root: Path, mode: str) -> AuditRunOutcome:
        from dpsynth_core.run_loop import run_method

        data_file = self.write_audit_file(records, root)
        return _outcome(run_method(self.audit_method(data_file, public_size, root, mode), resume=False))

    def released_records(self, release_dir: Path) -> list[str]:
        lines = (Path(release_dir) / "synthetic.jsonl").read_text(encoding="utf-8").splitlines()
        return [json.loads(line)["text"] for line in lines if line.strip()]

    def audited_run_dir(self) -> Path | None:
        return _same_config_run(self.config.resolved_run_dir(), self.config)


class DpFairTarget(AimTarget):
    """DPFairLLM (``dpsynth run dpfair``): a table, audited as AIM's (same canary rows and scores); ``dp_off``
    is the config's own epsilon = inf reference run (every DP table exact, DP-SGD without noise or clipping)."""

    method = "dpfair"

    def audit_method(self, data_file: Path, public_size: int, root: Path, mode: str) -> Method:
        """The config's stages for one audit run on ``data_file`` (``mode`` applied; nothing run)."""
        from dpsynth_core.tabular.pipeline import DpFairMethod

        cfg = self._audit_config(data_file, public_size, root)
        if mode == "dp_off":
            raw = cfg.model_dump(mode="json", by_alias=True)
            raw.update(privacy={**raw["privacy"], "epsilon": float("inf")}, not_private=True)
            cfg = type(cfg).model_validate(raw)
        return _AuditMethod(DpFairMethod(cfg), "broken_release" if mode == "broken_release" else "dp", "model",
                            None, _copy_private_rows)

    def run(self, records: pd.DataFrame, public_size: int, root: Path, mode: str) -> AuditRunOutcome:
        from dpsynth_core.run_loop import run_method

        data_file = _owner_only_file(root, ".csv")
        _write_private(data_file, lambda h: records.to_csv(h, index=False))
        return _outcome(run_method(self.audit_method(data_file, public_size, root, mode), resume=False))


TARGETS: dict[str, type[ReleaseTarget]] = {"aim": AimTarget, "wasp": PETarget, "augpe": PETarget, "actg": ActgTarget,
                                           "dpfair": DpFairTarget}


def release_target(method: str, config: Any) -> ReleaseTarget:
    """The audit target of ``method`` for ``config`` (a typed config, or a YAML path)."""
    from dpsynth.api.methods import METHODS

    if method not in TARGETS:
        raise ConfigError(f"field 'method': release audits cover {sorted(TARGETS)}, not '{method}'")
    if isinstance(config, (str, Path)):
        config = METHODS[method].from_yaml(config).config
    return TARGETS[method](config)


