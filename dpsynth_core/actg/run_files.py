"""An ACTG run directory and what its stages read from it: paths and completion markers, JSONL files,
the run's schema, the synthetic attribute rows and the generator's prompts.

Below the pipeline and its stages (``pipeline``, ``stages_post``, ``evaluation`` all import it), so
none of them imports another for these. ``cfg`` is the run's ``pipeline.ActgConfig``.
"""

from __future__ import annotations

import json
from pathlib import Path

from dpsynth_core.runs import StageMarkers
from dpsynth_core.runs.files import atomic_write_text


class RunDir(StageMarkers):
    """Paths and completion markers (``runs.StageMarkers``) of one run."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.root = Path(root)
        self.stages = self.dir

    # outputs
    schema = property(lambda self: self.root / "schema.yaml")
    reward_model = property(lambda self: self.root / "reward_model")
    plain_eval = property(lambda self: self.root / "plain_eval.jsonl")
    rl_prompts = property(lambda self: self.root / "rl_prompts.csv")
    features = property(lambda self: self.root / "features.csv")
    generator = property(lambda self: self.root / "generator")
    candidates = property(lambda self: self.root / "candidates.jsonl")
    anchors = property(lambda self: self.root / "anchors.jsonl")
    rl = property(lambda self: self.root / "rl")
    synthetic = property(lambda self: self.root / "synthetic.jsonl")
    metrics = property(lambda self: self.root / "metrics.json")
    plots = property(lambda self: self.root / "plots")


def write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def set_torch_threads(cfg) -> None:
    from dpsynth_core.config.placement import apply_torch_threads

    apply_torch_threads(cfg.torch_threads)


def load_run_schema(cfg, root: Path):
    """The run's copy of the schema (stage ``schema``), else the configured file."""
    from dpsynth_core.actg.schema import load_schema

    rd = RunDir(root)
    return load_schema(rd.schema if rd.schema.is_file() else cfg.resolved(cfg.schema_path))


def synthetic_rows(cfg, rd: RunDir) -> list[dict]:
    """The DP synthetic attribute table (features.csv), checked against the schema."""
    import pandas as pd

    schema = load_run_schema(cfg, rd.root)
    table = pd.read_csv(rd.features, dtype=str, keep_default_na=False)
    schema.validate_table(table, source=str(rd.features))
    return table[schema.field_names].to_dict("records")


def generator_prompts(cfg, rd: RunDir, rows: list[dict] | None, count: int) -> list[str]:
    """One prompt per attribute row (``rows``), or ``count`` unconditional prompts when ``rows`` is None."""
    from dpsynth_core.actg.generator import format_prompt

    template = cfg.template_text()
    if rows is None:
        return [format_prompt(None, None, template, text_description=cfg.data.text_description)] * count
    schema = load_run_schema(cfg, rd.root)
    return [format_prompt(schema, r, template, text_description=cfg.data.text_description) for r in rows]
