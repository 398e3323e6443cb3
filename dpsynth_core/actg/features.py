"""DP attribute features: AIM (smartnoise-synth) on the categorical attribute table, under eps1.

    synth = synthesize_features(real_attrs, schema, epsilon=2.0, n_rows=300, ledger=ledger,
                                out_path=run_dir / "features.csv")
    marginal_djs(real_attrs, synth, order=2, categories=schema.categories())

Privacy accounting. AIM is a rho-zCDP mechanism: smartnoise converts (epsilon, delta) to rho with
``snsynth.utils.cdp_rho`` (OpenDP's zCDP -> approx-DP map, Canonne-Kamath-Steinke 2020) and spends
exactly that rho. We compute rho the same way, take the min with the privacy core's own
``epsilon_to_zcdp`` (same conversion, rounded to the safe side), force AIM to spend that rho, and
record ``ZCdpEvent(rho)``: the ledger's epsilon for the event is then <= eps1 at the ledger's delta.
``ledger.check`` runs BEFORE AIM reads any row, so an over-budget request touches nothing.

The domain of every column is the schema's public option list (the transformer is fitted on the
options, not on the data), so no category is learnt from private records for free.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth_core.actg.schema import AttributeSchema
from dpsynth_core.errors import ConfigError, DataError
from dpsynth_core.privacy.aim import make_aim, sample_rows

DEFAULT_STAGE = "aim_features"


def aim_rho(epsilon: float, delta: float) -> float:
    """The rho AIM spends for (epsilon, delta): smartnoise's own conversion, capped by the
    privacy core's (both are CKS 2020; the min only guards against numerical differences)."""
    from dpsynth_core.privacy import epsilon_to_zcdp

    if epsilon <= 0 or not (0 < delta < 1):
        raise ConfigError(f"AIM needs epsilon > 0 and 0 < delta < 1 (got epsilon={epsilon}, delta={delta})")
    core = epsilon_to_zcdp(epsilon, delta)
    try:
        from snsynth.utils import cdp_rho

        with contextlib.redirect_stdout(io.StringIO()):
            smartnoise = float(cdp_rho(epsilon, delta))
    except Exception:  # OpenDP missing or refusing the float feature: the core's value is the same map
        smartnoise = core
    rho = min(core, smartnoise)
    # Both conversions are bisections; nudge rho down until the ledger's own epsilon is <= eps1
    # exactly (never above it, not even by a rounding error).
    from dpsynth_core.privacy import zcdp_to_epsilon

    for _ in range(100):
        if zcdp_to_epsilon(rho, delta) <= epsilon:
            break
        rho *= 1 - 1e-9
    return rho


def _public_transformer(schema: AttributeSchema, columns: list[str]):
    """A snsynth TableTransformer whose label encoders are fitted on the schema's options only."""
    from snsynth.transform import LabelTransformer, TableTransformer

    width = max(len(schema.options(c)) for c in columns)
    public = pd.DataFrame({
        c: [schema.options(c)[i % len(schema.options(c))] for i in range(width)] for c in columns
    })
    tt = TableTransformer([LabelTransformer(nullable=False) for _ in columns])
    with contextlib.redirect_stdout(io.StringIO()):
        tt.fit(public)
    return tt


def synthesize_features(
    real: pd.DataFrame,
    schema: AttributeSchema,
    *,
    epsilon: float,
    n_rows: int,
    ledger,
    stage: str = DEFAULT_STAGE,
    columns: list[str] | None = None,
    seed: int | None = None,
    out_path: str | Path | None = None,
    source: str = "attributes",
    **aim_kwargs,
) -> pd.DataFrame:
    """Fit AIM on the real attribute table under ``epsilon`` (at the ledger's delta) and sample
    ``n_rows`` synthetic rows (shuffled; AIM emits them sorted). Checks the ledger before
    touching the data and records ``ZCdpEvent(rho)`` after. ``aim_kwargs`` go to
    ``AIMSynthesizer`` (e.g. ``max_model_size``, ``rounds``, ``degree``).
    AIM's selection and measurement noise come from OS entropy (``privacy.aim``); ``seed`` only
    seeds the post-processing: sampling rows from the fitted model and their shuffle.
    Writes ``out_path`` (CSV) atomically when given."""
    from dpsynth_core.privacy import ZCdpEvent

    columns = list(columns or schema.field_names)
    if n_rows <= 0:
        raise ConfigError(f"n_rows must be > 0 (got {n_rows})")
    rounds = aim_kwargs.get("rounds")
    # smartnoise's AIM first measures every 1-way marginal at the noise it sized for `rounds` rounds, each
    # costing 0.9 rho / rounds: with rounds <= 0.9 x columns that phase alone spends the whole rho or more
    # (its next noise scale is then sqrt of a negative number: "Probabilities contain NaN")
    if rounds is not None and not rounds > 0.9 * len(columns):
        raise ConfigError(f"features.options.rounds: {rounds} rounds are too few for {len(columns)} columns "
                          f"(AIM's 1-way phase alone would spend the budget); use more than "
                          f"{math.floor(0.9 * len(columns))}, or leave it out (AIM's default: 16 x columns)")
    delta = float(ledger.delta)
    rho = aim_rho(epsilon, delta)
    event = ZCdpEvent(rho=rho)
    event_eps = event.epsilon(delta)
    if event_eps > epsilon:  # the conversion must never over-spend eps1
        raise RuntimeError(f"AIM rho={rho} costs epsilon {event_eps} > {epsilon}")
    ledger.check(stage, event)  # BudgetExceededError here, before any private row is read

    sub = schema.__class__(name=schema.name, fields=[schema.field(c) for c in columns])
    sub.validate_table(real, source=source)
    data = real[columns].astype(str).reset_index(drop=True)

    aim = make_aim(epsilon, delta, rho, **aim_kwargs)
    transformer = _public_transformer(schema, columns)
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        # AIM prints progress (sigma, cliques); mbi warns about its own pandas input path.
        warnings.filterwarnings("ignore", category=UserWarning, module=r"mbi(\..*)?")
        aim.fit(data, transformer=transformer, categorical_columns=columns)
        sampled = sample_rows(aim, n_rows, seed)  # post-processing: the config seed is allowed here
    ledger.record(stage, event, details={
        "mechanism": "AIM (smartnoise-synth)", "epsilon_target": epsilon, "delta": delta,
        "rho": rho, "epsilon_of_event": event_eps, "columns": columns, "n_rows": n_rows,
    })

    synth = pd.DataFrame(sampled, columns=columns) if not isinstance(sampled, pd.DataFrame) else sampled
    synth.columns = columns
    rng = np.random.default_rng(seed)
    synth = synth.iloc[rng.permutation(len(synth))].reset_index(drop=True)
    sub.validate_table(synth, source="AIM output")
    if out_path is not None:
        write_csv_atomic(synth, out_path)
    return synth


def write_csv_atomic(frame: pd.DataFrame, path: str | Path) -> Path:
    """Write a CSV to a temp file in the same directory, then rename it into place."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        frame.to_csv(tmp, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# ---------------------------------------------------------------------------------------------
# Marginal fidelity
# ---------------------------------------------------------------------------------------------
def _distribution(frame: pd.DataFrame, cols: tuple[str, ...], domains: list[list[str]]) -> np.ndarray:
    index = pd.MultiIndex.from_product(domains) if len(cols) > 1 else pd.Index(domains[0])
    counts = frame.groupby(list(cols) if len(cols) > 1 else cols[0], observed=True).size()
    counts = counts.reindex(index, fill_value=0).to_numpy(dtype=float)
    total = counts.sum()
    return counts / total if total > 0 else counts


def marginal_djs(real: pd.DataFrame, synth: pd.DataFrame, order: int = 1,
                 categories: dict[str, list[str]] | None = None,
                 columns: list[str] | None = None) -> dict:
    """Jensen-Shannon distance (scipy's default base e, in [0, sqrt(ln 2)] = [0, 0.833], the convention
    of the ACTG-ARL reference's figures) between real and synthetic ``order``-way
    marginals. Returns ``{"order", "mean", "max", "per_marginal": {"a" or "a|b": d}}``.
    ``categories`` (e.g. ``schema.categories()``) fixes each column's domain; otherwise the
    union of the values seen in both tables is used."""
    from scipy.spatial.distance import jensenshannon

    if order not in (1, 2):
        raise ConfigError(f"marginal order must be 1 or 2 (got {order})")
    columns = list(columns or (list(categories) if categories else list(real.columns)))
    for name, frame in (("real", real), ("synthetic", synth)):
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise DataError(f"marginal_djs: {name} table lacks column(s) {missing}")
    if len(real) == 0 or len(synth) == 0:
        raise DataError("marginal_djs: both tables need at least one row")
    if order == 2 and len(columns) < 2:
        raise DataError("marginal_djs: 2-way marginals need at least two columns")
    domains = {}
    for c in columns:
        if categories and c in categories:
            domains[c] = list(categories[c])
            extra = (set(real[c].astype(str)) | set(synth[c].astype(str))) - set(domains[c])
            domains[c] += sorted(extra)
        else:
            domains[c] = sorted(set(real[c].astype(str)) | set(synth[c].astype(str)))
    r, s = real[columns].astype(str), synth[columns].astype(str)
    per = {}
    for cols in itertools.combinations(columns, order):
        p = _distribution(r, cols, [domains[c] for c in cols])
        q = _distribution(s, cols, [domains[c] for c in cols])
        per["|".join(cols)] = float(np.nan_to_num(jensenshannon(p, q)))
    values = list(per.values())
    return {"order": order, "mean": float(np.mean(values)), "max": float(np.max(values)),
            "per_marginal": per}
