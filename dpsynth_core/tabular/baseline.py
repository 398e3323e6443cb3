"""AIM baseline (smartnoise-synth) at the same (epsilon, delta), on the same columns.

The snsynth transformer is fit on a *public* frame built from the schema (every category, the
numeric bounds), never on the private data, so it spends no budget and learns nothing. Numeric
columns are binned into ``bins`` equal-width bins over the public bounds and decoded back to bin
values. AIM's zCDP budget rho = cdp_rho(epsilon, delta) is checked and recorded in the ledger as
a ``ZCdpEvent``. AIM's selection and measurement noise come from OS entropy
(``privacy.aim``); ``seed`` only seeds post-processing (sampling rows from the fitted
model, shuffling them). AIM prints progress to stdout: it is suppressed. Its output comes sorted:
shuffled.
"""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pandas as pd

from dpsynth_core.tabular.schema import TableSchema


def _public_frame(schema: TableSchema, bins: int) -> pd.DataFrame:
    width = max([len(c.categories or []) for c in schema.columns if c.is_categorical] + [bins + 1, 2])
    data = {}
    for col in schema.columns:
        if col.is_categorical:
            cats = list(col.categories or [])
            data[col.name] = [cats[i % len(cats)] for i in range(width)]
        else:
            data[col.name] = np.linspace(float(col.min), float(col.max), width)
    return pd.DataFrame(data)


def aim_synthesize(
    real: pd.DataFrame,
    schema: TableSchema,
    *,
    epsilon: float,
    ledger,
    num_rows: int,
    stage: str = "aim_baseline",
    bins: int = 16,
    seed: int = 0,
    rho: float | None = None,
) -> pd.DataFrame:
    """Fit AIM on ``real`` (validated against ``schema``) and sample ``num_rows`` rows (a public
    number: sampling as many rows as the private table has would publish its size). ``rho``: spend
    exactly this zCDP rho instead of the one (epsilon, delta) converts to (the release audit's noise-off
    mode passes an enormous one, with a ledger that records nothing)."""
    from snsynth.transform import BinTransformer, LabelTransformer, TableTransformer
    from snsynth.utils import cdp_rho

    from dpsynth_core.privacy import ZCdpEvent
    from dpsynth_core.privacy.aim import make_aim, sample_rows

    real = schema.validate_frame(real, "AIM input")
    spend = float(cdp_rho(epsilon, ledger.delta)) if rho is None else float(rho)
    event = ZCdpEvent(rho=spend)
    ledger.check(stage, event)  # before touching the data
    transformers = [
        LabelTransformer(nullable=False) if c.is_categorical else BinTransformer(bins=bins, lower=float(c.min), upper=float(c.max), nullable=False)
        for c in schema.columns
    ]
    tt = TableTransformer(transformers)
    tt.fit(_public_frame(schema, bins))  # public: no epsilon, no private data
    synth = make_aim(float(epsilon), float(ledger.delta), rho=rho, verbose=False)  # secret selection noise; rho None: AIM converts
    with contextlib.redirect_stdout(io.StringIO()):
        synth.fit(real, transformer=tt, preprocessor_eps=0.0)
        out = sample_rows(synth, num_rows, seed)  # post-processing: seeded sampling only
    ledger.record(stage, event, details={"synthesizer": "aim", "epsilon": epsilon, "delta": ledger.delta, "bins": bins})
    out = pd.DataFrame(out, columns=schema.names)
    for c in schema.columns:
        if not c.is_categorical:
            out[c.name] = pd.to_numeric(out[c.name]).clip(c.min, c.max).round(c.decimals)
            if c.type == "integer":
                out[c.name] = out[c.name].astype(int)
    return out.sample(frac=1.0, random_state=seed).reset_index(drop=True)
