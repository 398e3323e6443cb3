"""Pre-flight: every check a run can make before it writes a file or starts Ray.

    plan = preflight("actg", Path("configs/actg_demo.yaml"))   # raises ConfigError / DataError
    print(plan.render())                                        # what `--check` prints

One function per pipeline. Each loads the config strictly (errors name the full field path; an
empty file is an error; caps on every size knob), reads and validates the WHOLE private file
(errors name file, column and 1-based row, never a value), and resolves delta against the
public expected size, so a bad file or config fails in seconds and leaves nothing on disk.
`dpsynth run <pipeline>` and `dpsynth train` call it first; the drivers repeat their own checks.

The plan's ``rows`` (rows in the private file) is a private statistic: it is printed only to
the data owner's terminal by ``--check`` (as ``dpsynth data check`` does) and never logged or stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from dpsynth_core.errors import ConfigError


@dataclass(frozen=True)
class Plan:
    """What a run would do, as far as it is known before it starts."""

    pipeline: str
    config: Path
    stages: list[str]
    epsilon: float | None  # None: no privacy cost (post-processing of a DP model)
    delta: float | None
    data: str
    rows: int
    output_dir: Path

    def render(self) -> str:
        return "\n".join([
            f"pre-flight OK: {self.pipeline} ({self.config})",
            f"stages:     {' -> '.join(self.stages)}",
            f"privacy:    epsilon {self.epsilon:g} at delta {self.delta:.3g}" if self.epsilon is not None
            else "privacy:    none spent (post-processing of a DP model)",
            f"data:       {self.data}: {self.rows} rows, valid" + (" (owner-only figure)" if self.epsilon is not None else ""),
            f"output dir: {self.output_dir.resolve()}",
            "nothing was written (--check)",
        ])


def check_actg(path: Path) -> Plan:
    from dpsynth_core.actg.data_split import load_frame, load_private_split
    from dpsynth_core.actg.pipeline import load_actg_config
    from dpsynth_core.actg.schema import load_schema
    from dpsynth_core.privacy import check_delta_for_size, default_delta
    from dpsynth_core.runs.storage import require_durable_run_dir

    cfg = load_actg_config(path)
    run_dir = require_durable_run_dir(cfg.resolved_run_dir())
    if cfg.mode == "actg":
        load_schema(cfg.resolved(cfg.schema_path))
    cfg.template_text()
    m = cfg.data.n_records
    delta = check_delta_for_size(cfg.privacy.delta, m, "privacy.delta") if cfg.privacy.delta else default_delta(m)
    rows = len(load_frame(cfg))  # the whole file, validated
    load_private_split(cfg)  # held-out and private sets fit (the drawn set is discarded)
    return Plan("actg", Path(path), list(cfg.stages), cfg.privacy.epsilon, delta,
                str(cfg.data.path or "bioRxiv (data dir)"), rows, run_dir)


def check_pe(path: Path, method: str) -> Plan:
    from dpsynth_core.pe.data_split import split_data
    from dpsynth_core.pe.pipeline import load_pe_config, resolve_delta
    from dpsynth_core.pe.prompts import load_prompts
    from dpsynth_core.runs.storage import require_durable_run_dir

    cfg = load_pe_config(path, method)
    run_dir = require_durable_run_dir(cfg.run_dir)
    delta = resolve_delta(cfg)
    load_prompts(cfg.prompts)
    private, test_texts, _, _ = split_data(cfg)  # whole file validated; the drawn set is discarded
    vote = "Top-Q contrastive vote" if method == "wasp" else "nearest-neighbour vote"
    stages = [f"{cfg.iterations} x (generate with {len(cfg.plms)} PLM(s) -> DP {vote})", "synthetic.jsonl"]
    if cfg.evaluate:
        stages.append("evaluate")
    source = str(cfg.data.path) if cfg.data.source == "file" else "bioRxiv (data dir)"
    return Plan(method, Path(path), stages, cfg.epsilon, delta, source, _pe_rows(cfg), run_dir)


def _pe_rows(cfg) -> int:
    from dpsynth_core.pe.data_split import _load_frame

    return len(_load_frame(cfg)[0])


def check_dpfair(path: Path) -> Plan:
    from dpsynth_core.tabular import private_data
    from dpsynth_core.tabular.config import load_dpfair_config
    from dpsynth_core.tabular.pipeline import _wanted, public_schema

    cfg = load_dpfair_config(path)
    schema = public_schema(cfg)
    rows, delta = private_data.preflight(cfg, schema)
    return Plan("dpfair", Path(path), _wanted(cfg, schema), cfg.epsilon, delta,
                private_data.source_name(cfg), rows, cfg.run_dir())


def check_aim(path: Path) -> Plan:
    from dpsynth_core.tabular import private_data
    from dpsynth_core.tabular.aim_run import STAGES
    from dpsynth_core.tabular.config import load_aim_config
    from dpsynth_core.tabular.schema import load_schema

    cfg = load_aim_config(path)
    schema = load_schema(cfg.schema_path).select(cfg.columns)
    rows, delta = private_data.preflight(cfg, schema)
    return Plan("aim", Path(path), list(STAGES), cfg.epsilon, delta, private_data.source_name(cfg), rows,
                cfg.run_dir())


def check_train(path: Path, fresh: bool = False) -> Plan:
    """`dpsynth train`: config, the whole data file, delta against its size, and the noise calibration."""
    from dpsynth.cli.train import TrainJobConfig, data_source
    from dpsynth_core.config import load_config
    from dpsynth_core.dpsgd.budget import plan_privacy
    from dpsynth_core.privacy.randomness import refuse_pinned_dp_seed

    job = load_config(path, TrainJobConfig)
    try:  # a pinned seed makes the noise reproducible from this file: tests only (DPSYNTH_TEST_MODE=1)
        refuse_pinned_dp_seed("train.sampling_seed", job.train.sampling_seed)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    source = data_source(job.data, Path(path))
    examples = source.load()
    if not examples:
        raise ConfigError(f"{path}: field 'data': no training records in {job.data.path}")
    try:
        plan = plan_privacy(job.train, examples, ledger=_existing_ledger(job, fresh), stage=job.stage)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    stages = [f"{job.stage}: {job.train.steps} DP-SGD steps (noise multiplier {plan.noise_multiplier:.3f})",
              "release"]
    return Plan("train", Path(path), stages, job.train.epsilon, plan.delta, source.path, len(examples),
                Path(job.output_dir))


def _existing_ledger(job, fresh: bool = False):
    """The run's ledger if it exists already (opened, never created: pre-flight writes nothing)."""
    from dpsynth_core.privacy import PrivacyLedger

    run_dir = Path(job.ledger.run_dir or job.output_dir)
    if fresh and run_dir == Path(job.output_dir):  # --fresh moves this ledger aside with the old run
        return None
    return PrivacyLedger.open(run_dir) if (run_dir / "ledger.sqlite").is_file() else None


PREFLIGHTS: dict[str, Callable[[Path], Plan]] = {
    "actg": check_actg,
    "wasp": partial(check_pe, method="wasp"),
    "augpe": partial(check_pe, method="augpe"),
    "dpfair": check_dpfair,
    "aim": check_aim,
    "train": check_train,
}


def preflight(pipeline: str, config_path: Path, *, fresh: bool = False) -> Plan:
    """Run ``pipeline``'s pre-flight on ``config_path``; raise ConfigError / DataError on the first problem.
    ``fresh`` (train): the run's own ledger is about to be moved aside, so it is not checked against."""
    if pipeline == "train":
        return check_train(Path(config_path), fresh=fresh)
    return PREFLIGHTS[pipeline](Path(config_path))
