"""`dpsynth train --config FILE`: DP-SGD LoRA fine-tuning (in-process, or Ray Train for num_workers > 1).

Everything that can be wrong with a config fails here, before any training: epsilon <= 0,
delta >= 1/n, a logical batch larger than n, an unknown LoRA target module, a missing column.
"""

from __future__ import annotations

import string
from pathlib import Path

import typer
from pydantic import Field, model_validator

from dpsynth_core.config import StrictConfig
from dpsynth_core.dpsgd.config import DpSgdConfig
from dpsynth_core.errors import ConfigError

app = typer.Typer(help="DP-SGD LoRA fine-tuning on Ray Train.", no_args_is_help=True)


class TrainDataSpec(StrictConfig):
    """Where the private training data is and how a row becomes (prompt, target)."""

    path: str  # absolute, relative to the working directory, or relative to the data dir (../shared/data)
    text_column: str  # the target text (loss is taken on it)
    prompt_columns: list[str] = Field(default_factory=list)
    # e.g. "Category: {category}\n"; default: one "column: value" line per prompt column
    prompt_template: str | None = None
    user_column: str | None = None  # set for user-level DP
    max_records: int | None = Field(None, ge=1)
    max_chars: int = Field(20000, ge=1)

    @model_validator(mode="after")
    def _template_fields(self) -> TrainDataSpec:
        if self.prompt_template is not None:
            fields = {f for _, f, _, _ in string.Formatter().parse(self.prompt_template) if f}
            unknown = sorted(fields - set(self.prompt_columns))
            if unknown:
                raise ValueError(f"prompt_template uses {unknown}, which are not in prompt_columns {self.prompt_columns}")
        return self


class LedgerSpec(StrictConfig):
    run_dir: str | None = None  # default: the output directory
    dataset: str = "private"
    epsilon_budget: float | None = Field(None, gt=0)  # default: train.epsilon (used only when creating)


class TrainJobConfig(StrictConfig):
    data: TrainDataSpec
    train: DpSgdConfig
    output_dir: str = "runs/train"
    stage: str = "dpsgd"
    ledger: LedgerSpec = Field(default_factory=LedgerSpec)


def resolve_data_path(raw: str, config_path: Path) -> Path:
    p = Path(raw).expanduser()
    if p.is_absolute():
        return p
    for base in (Path.cwd(), config_path.parent):
        if (base / p).exists():
            return base / p
    from dpsynth_core.data import data_dir

    return data_dir() / p


def build_examples(spec: TrainDataSpec, config_path: Path):
    """Read the data through ``dpsynth_core.data.load_records`` (errors name file/column/row)."""
    from dpsynth_core.data import load_records
    from dpsynth_core.dpsgd.config import TrainExample

    path = resolve_data_path(spec.path, config_path)
    frame = load_records(
        path, text_col=spec.text_column, user_col=spec.user_column,
        columns=list(spec.prompt_columns) or None, max_chars=spec.max_chars,
    )
    if spec.max_records is not None:
        frame = frame.iloc[: spec.max_records]
    examples = []
    for _, row in frame.iterrows():
        values = {c: "" if row[c] is None else str(row[c]) for c in spec.prompt_columns}
        if spec.prompt_template is not None:
            prompt = spec.prompt_template.format(**values)
        else:
            prompt = "".join(f"{c}: {v}\n" for c, v in values.items())
        user = str(row[spec.user_column]) if spec.user_column else None
        examples.append(TrainExample(prompt=prompt, target=str(row[spec.text_column]), user_id=user))
    return examples


def open_ledger(job: TrainJobConfig, n_units: int):
    from dpsynth_core.privacy import PrivacyLedger, default_delta

    run_dir = Path(job.ledger.run_dir or job.output_dir)
    if (run_dir / "ledger.sqlite").is_file():
        return PrivacyLedger.open(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    delta = job.train.delta if job.train.delta is not None else default_delta(max(n_units, 2))
    return PrivacyLedger.create(run_dir, job.ledger.dataset, job.ledger.epsilon_budget or job.train.epsilon, delta)


@app.callback(invoke_without_command=True)
def train(
    config: Path = typer.Option(..., "--config", "-c", help="YAML with data:, train: (DpSgdConfig), output_dir:, ledger:."),
    resume: bool = typer.Option(True, "--resume/--no-resume", help="Continue from output_dir/checkpoint if present."),
    progress: bool = typer.Option(True, "--progress/--no-progress"),
) -> None:
    """Fine-tune a LoRA adapter with DP-SGD; writes adapter/, training_curve.png and a ledger entry."""
    from rich.console import Console

    from dpsynth_core.config import load_config
    from dpsynth_core.dpsgd import train_dp_lora
    from dpsynth_core.dpsgd.budget import plan_privacy
    from dpsynth_core.dpsgd.sampling import PrivacyUnits

    job = load_config(config, TrainJobConfig)
    examples = build_examples(job.data, Path(config))
    if not examples:
        raise ConfigError(f"{config}: field 'data': no training records in {job.data.path}")
    n_units = len(PrivacyUnits.from_user_ids([e.user_id for e in examples]))
    ledger = open_ledger(job, n_units)
    try:
        plan_privacy(job.train, examples, ledger=ledger, stage=job.stage)  # every check, before training
    except ConfigError as exc:
        raise ConfigError(f"{config}: {exc}") from None
    result = train_dp_lora(examples, job.train, output_dir=Path(job.output_dir), ledger=ledger, stage=job.stage,
                           progress=progress, resume=resume)
    console = Console()
    if not result.completed:
        console.print(f"[yellow]stopped after {result.steps} steps (stop_after_steps); rerun to resume[/yellow]")
        return
    console.print(
        f"[green]done[/green]: {result.steps} steps, epsilon={result.epsilon:.4f} at delta={result.delta:.3g} "
        f"(noise multiplier {result.noise_multiplier:.4f}, sampling rate {result.sampling_rate:.4g})"
    )
    console.print(f"adapter: {result.adapter_dir}\ncurve:   {result.curve_png}")
    if result.merged_dir:
        console.print(f"merged:  {result.merged_dir}")
    console.print(ledger.render())
