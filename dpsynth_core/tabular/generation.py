"""Fairness-aware constrained generation of table rows.

Rows come out of the HF engine (``engines.HFEngine.generate_processed``) under :class:`ConstrainedRowProcessor`
(so every row parses), or of vLLM under the same rows' regex.
A :class:`GapTracker` keeps running counts of the generated rows: the demographic-parity gap
(max - min over groups of P(Y = pos | A = a)) and the equalized-odds gap of the generator's own
implied classifier (y_hat = [p_theta(Y = pos | row so far) >= 0.5]; max over y of the spread over
groups of P(y_hat = 1 | Y = y, A = a)), one tracker per sensitive attribute. With fairness on, a row
that would push a tracked gap of ANY attribute above its threshold (or further from the target
rates) is rejected and another is sampled.

This stage sees only the DP generator, never the private data: it is post-processing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch
from transformers import LogitsProcessorList

from dpsynth_core.config.placement import PlacementSettings
from dpsynth_core.errors import ConfigError
from dpsynth_core.tabular.config import FairGenerationSettings, GenerationSettings
from dpsynth_core.tabular.constrained import ConstrainedRowProcessor, RowConstraint
from dpsynth_core.tabular.serialize import RowSerializer

__all__ = ["FairGenerationSettings", "GenerationResult", "GapTracker", "GenerationSettings", "dp_gap_of", "generate_rows",
           "open_row_generator"]


@dataclass
class GapTracker:
    """Running demographic-parity and equalized-odds gaps over accepted rows."""

    groups: list[str]
    n: dict[str, int] = field(default_factory=dict)
    pos: dict[str, int] = field(default_factory=dict)
    n_y: dict[tuple[str, int], int] = field(default_factory=dict)
    pred_y: dict[tuple[str, int], int] = field(default_factory=dict)

    def add(self, group: str, y: int, y_hat: int, sign: int = 1) -> None:
        self.n[group] = self.n.get(group, 0) + sign
        self.pos[group] = self.pos.get(group, 0) + sign * y
        self.n_y[(group, y)] = self.n_y.get((group, y), 0) + sign
        self.pred_y[(group, y)] = self.pred_y.get((group, y), 0) + sign * y_hat

    def rates(self) -> dict[str, float]:
        return {a: self.pos[a] / self.n[a] for a in self.groups if self.n.get(a, 0) > 0}

    def dp_gap(self) -> float:
        r = list(self.rates().values())
        return max(r) - min(r) if len(r) > 1 else 0.0

    def eo_gap(self) -> float:
        gaps = []
        for y in (0, 1):
            r = [self.pred_y[(a, y)] / self.n_y[(a, y)] for a in self.groups if self.n_y.get((a, y), 0) > 0]
            if len(r) > 1:
                gaps.append(max(r) - min(r))
        return max(gaps) if gaps else 0.0

    def target_distance(self, target: dict[str, float]) -> float:
        r = self.rates()
        return max((abs(r[a] - t) for a, t in target.items() if a in r), default=0.0)

    def total(self) -> int:
        return sum(self.n.values())


def _accept(trackers: dict[str, GapTracker], fs: FairGenerationSettings, groups: dict[str, str], y: int, y_hat: int,
            targets: dict[str, dict[str, float] | None] | None = None) -> bool:
    """Add the row if, for EVERY sensitive attribute, it keeps each enforced gap under its threshold or
    does not worsen it (``targets[attribute]``: target rates, enforced instead of the DP gap)."""
    targets = targets or {}

    def gaps(attribute: str) -> tuple[float, float, float]:
        t = trackers[attribute]
        return t.dp_gap(), t.eo_gap(), t.target_distance(targets.get(attribute) or {})

    before = {a: gaps(a) for a in trackers}
    for a, t in trackers.items():
        t.add(groups[a], y, y_hat)
    if next(iter(trackers.values())).total() <= fs.warmup_rows:
        return True
    for a in trackers:
        has_target = bool(targets.get(a))
        limits = (None if has_target else fs.max_dp_gap, fs.max_eo_gap, fs.max_dp_gap if has_target else None)
        for b, now, lim in zip(before[a], gaps(a), limits):
            if lim is not None and now > lim and now > b + 1e-12:
                for attr, t in trackers.items():
                    t.add(groups[attr], y, y_hat, sign=-1)
                return False
    return True


@dataclass
class GenerationResult:
    frame: pd.DataFrame
    attempted: int
    invalid: int
    rejected: int
    gap_history: list[dict]

    @property
    def valid_fraction(self) -> float:
        return (self.attempted - self.invalid) / max(self.attempted, 1)


def open_row_generator(base_model: str, adapter_dir, settings: GenerationSettings, engine: str = "auto",
                       placement: PlacementSettings | None = None):
    """The row generator as a :class:`~dpsynth_core.engines.TextEngine` for :func:`generate_rows`, on the run's
    ``placement`` (default: auto).

    Fairness-aware generation stays on HF: it reads the generator's own P(Y = pos | row so far)
    from the full logits at the target's value start (the processor records them), which vLLM
    only returns as top-k log-probs. Without fairness, ``engine`` decides (vLLM: structured outputs).
    """
    from dpsynth_core.engines import EngineConfig, load_engine

    backend = "hf" if settings.fairness.enabled else engine
    place = placement or PlacementSettings()
    return load_engine(EngineConfig(model=base_model, adapter_dir=adapter_dir, backend=backend,
                                    hf_batch_size=settings.batch_size, max_model_len=1024,
                                    device=place.device, dtype=place.dtype))


def _generate_rows_structured(engine, serializer: RowSerializer, settings: GenerationSettings) -> GenerationResult:
    """vLLM: each row's text is held to the regex of its column order (structured outputs)."""
    from dpsynth_core.engines import SamplingParams
    from dpsynth_core.tabular.row_regex import max_row_tokens, row_regex

    rows: list[dict] = []
    attempted = invalid = 0
    max_attempts = int(settings.num_rows * settings.max_attempts_factor)
    batch_no = 0
    while len(rows) < settings.num_rows and attempted < max_attempts:
        bs = min(max(settings.batch_size, settings.num_rows - len(rows)), max_attempts - attempted)
        orders = [serializer.order_for_row() for _ in range(bs)]
        params = [SamplingParams(max_new_tokens=max_row_tokens(serializer, o), temperature=settings.temperature,
                                 top_p=settings.top_p, seed=(settings.seed * 100003 + batch_no) % 2**62,
                                 regex=row_regex(serializer, o)) for o in orders]
        batch_no += 1
        for text in engine.generate([serializer.prompt(o) for o in orders], params):
            attempted += 1
            try:
                rows.append(serializer.parse(text))
            except Exception:  # noqa: BLE001 - counted, never shown
                invalid += 1
            if len(rows) >= settings.num_rows:
                break
    frame = pd.DataFrame(rows, columns=serializer.schema.names)
    if len(frame):
        frame = frame.sample(frac=1.0, random_state=settings.seed).reset_index(drop=True)
    return GenerationResult(frame=frame, attempted=attempted, invalid=invalid, rejected=0, gap_history=[])


class StratumQuota:
    """Which values of ``columns`` the next generated row is fixed to: the cell furthest below its share
    (``shares``: cell -> share, a cell being one value per column, e.g. a DP table's counts), so every
    prefix of the rows tracks the shares. One column's cells may be given as plain values."""

    def __init__(self, columns: str | Sequence[str], shares: dict):
        self.columns = (columns,) if isinstance(columns, str) else tuple(columns)
        cells = {(k,) if isinstance(k, str) else tuple(k): max(float(v), 0.0) for k, v in shares.items()}
        if any(len(cell) != len(self.columns) for cell in cells):
            raise ValueError(f"stratified generation: every cell needs one value per column of {list(self.columns)}")
        total = sum(cells.values())
        if total <= 0:
            raise ConfigError(f"stratified generation: no positive share for {' x '.join(self.columns)}")
        self.shares = {cell: v / total for cell, v in cells.items()}
        self.counts = dict.fromkeys(self.shares, 0)

    def next(self) -> dict[str, str]:
        n = sum(self.counts.values()) + 1
        cell = max(self.shares, key=lambda k: n * self.shares[k] - self.counts[k])
        self.counts[cell] += 1
        return dict(zip(self.columns, cell))


def generate_rows(model, tokenizer, serializer: RowSerializer, settings: GenerationSettings, *, progress: bool = True,
                  strata: StratumQuota | None = None) -> GenerationResult:
    """Sample ``settings.num_rows`` rows (fewer only if max attempts run out) under constrained decoding.

    ``model``: an HF model, or an engine from :func:`open_row_generator` (``tokenizer`` unused):
    vLLM generates under the schema's row regex, an HF engine runs the logits processor below.
    ``strata``: each row's values of the quota's categorical columns are fixed by it (HF engine only).
    """
    from dpsynth_core.engines import SamplingParams, TextEngine
    from dpsynth_core.engines.hf_engine import HFEngine

    if isinstance(model, TextEngine):
        if model.backend == "vllm":
            if settings.fairness.enabled or strata is not None:
                raise ConfigError("fairness-aware or stratified generation needs the hf engine (see open_row_generator)")
            return _generate_rows_structured(model, serializer, settings)
        engine = model
    else:
        engine = HFEngine.from_loaded(model, tokenizer, batch_size=settings.batch_size)
    tokenizer = engine.tokenizer
    schema = serializer.schema
    fs = settings.fairness
    attributes = fs.attributes(schema.sensitive)
    if fs.enabled and (not attributes or schema.target is None):
        raise ConfigError("fairness-aware generation needs a sensitive attribute and a target in the schema")
    for a in attributes if fs.enabled else []:
        if a not in schema.names:
            raise ConfigError(f"fairness-aware generation: unknown sensitive column '{a}'")
    constraint = RowConstraint(serializer, tokenizer)
    labels = list(schema.column(schema.target).categories or []) if schema.target else []
    pos_label = schema.positive() if schema.target else None
    label_first = [constraint.cat_ids[schema.target][y][0] for y in labels] if schema.target else []
    trackers = {a: GapTracker(groups=list(schema.column(a).categories or [])) for a in attributes} if fs.enabled else {}
    targets = {a: fs.targets_for(a, attributes) for a in attributes}
    tilts = []
    if fs.enabled and fs.tilt:  # decoding-time label tilt per group of each attribute (tabular.fair_decoding)
        from dpsynth_core.tabular.fair_decoding import LabelTilt, tilt_processor

        tilts = [LabelTilt(constraint, schema, a, targets[a], fs.tilt_step) for a in attributes]
    rows, history = [], []
    attempted = invalid = rejected = 0
    max_attempts = int(settings.num_rows * settings.max_attempts_factor)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=settings.num_rows, desc="generate rows", unit="row")
    engine.model.eval()
    batch_no = 0
    while len(rows) < settings.num_rows and attempted < max_attempts:
        bs = min(settings.batch_size, max_attempts - attempted)
        orders = [serializer.order_for_row() for _ in range(bs)]
        fixed = [strata.next() for _ in orders] if strata is not None else None
        proc = ConstrainedRowProcessor(constraint, orders, record_logits_for=[schema.target] if schema.target else [],
                                       fixed=fixed)
        params = SamplingParams(max_new_tokens=max(constraint.max_row_tokens(o) for o in orders),
                                temperature=settings.temperature, top_p=settings.top_p,
                                seed=(settings.seed * 100003 + batch_no) % 2**63)  # a config seed may be < 0
        batch_no += 1
        texts = engine.generate_processed(
            [serializer.prompt(o) for o in orders], params,
            LogitsProcessorList([proc] + ([tilt_processor(tilts, proc)] if tilts else [])))
        for text, state in zip(texts, proc.states):
            attempted += 1
            try:
                row = serializer.parse(text)
            except Exception:  # noqa: BLE001 - counted, never shown (the row is synthetic but keep logs clean)
                invalid += 1
                continue
            if fs.enabled:
                y = int(row[schema.target] == pos_label)
                logits = state.value_start_logits.get(schema.target)
                p_pos = float(torch.softmax(logits[label_first], -1)[labels.index(pos_label)]) if logits is not None else float(y)
                for tilt in tilts:
                    tilt.observe(row[tilt.sensitive], bool(y))
                if not _accept(trackers, fs, {a: row[a] for a in attributes}, y, int(p_pos >= 0.5), targets):
                    rejected += 1
                    continue
            rows.append(row)
            if bar is not None:
                bar.update(1)
            if len(rows) >= settings.num_rows:
                break
        if fs.enabled:
            history.append({"rows": len(rows), "rejected": rejected,
                            **{f"{k}_{a}": getattr(t, k)() for a, t in trackers.items() for k in ("dp_gap", "eo_gap")}})
            for tilt in tilts:
                tilt.update()
    if bar is not None:
        bar.close()
    frame = pd.DataFrame(rows, columns=schema.names)
    if len(frame):
        frame = frame.sample(frac=1.0, random_state=settings.seed).reset_index(drop=True)
    return GenerationResult(frame=frame, attempted=attempted, invalid=invalid, rejected=rejected, gap_history=history)


def dp_gap_of(frame: pd.DataFrame, sensitive: str, target: str, positive: str) -> float:
    """Demographic-parity gap of a table's own labels: max - min over groups of P(Y = pos | A)."""
    if frame.empty:
        return 0.0
    rates = frame.groupby(sensitive)[target].apply(lambda s: float(np.mean(s == positive)))
    return float(rates.max() - rates.min()) if len(rates) > 1 else 0.0
