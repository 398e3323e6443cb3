"""How often ``stratify: auto`` picks Adult's strongest sex-proxy (marital status) from noisy 2-way tables.

Owner-side simulation on the real rows (not a product path): draws of 1,000 Adult training rows, the
(column, sex) tables of education, marital status and occupation with Gaussian noise at the sd the
DPFairLLM recipe's marginals stage has (21 compositions, budget.marginals of epsilon = 1 and 4), counts
rounded and clamped at 0 as released; each draw's choice by plain Cramer's V and by the variance-weighted
one of ``tabular.strata``. Results: docs/results/dpfair_strata.md.

    DPSYNTH_DATA_DIR=/work/shared/data python experiments/dpfair_strata_probe.py --draws 200
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np
import pandas as pd

from dpsynth_core.data import load_adult
from dpsynth_core.privacy.gaussian_histogram import histogram_event
from dpsynth_core.tabular.recipe import recipe_settings
from dpsynth_core.tabular.schema import load_schema
from dpsynth_core.tabular.strata import noise_aware_cramers_v

CANDIDATES = ["education", "marital_status", "occupation"]


def table(rows: pd.DataFrame, schema, column: str) -> np.ndarray:
    """The (column, sex) counts over every schema category, as the marginals stage releases them."""
    x = pd.Categorical(rows[column].astype(str), categories=schema.column(column).categories)
    a = pd.Categorical(rows["sex"].astype(str), categories=schema.column("sex").categories)
    return pd.crosstab(x, a, dropna=False).to_numpy(float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=200)
    parser.add_argument("--rows", type=int, default=1000)
    args = parser.parse_args()
    schema, data = load_schema("configs/schemas/adult.yaml"), load_adult("train")
    rng = np.random.default_rng()
    for epsilon in (1.0, 4.0):
        share = recipe_settings(epsilon)["budget"]["marginals"]
        sigma, _ = histogram_event(epsilon * share, 1e-5, 21)
        picks = {"plain": Counter(), "variance-weighted": Counter()}
        for _ in range(args.draws):
            rows = data.sample(args.rows, random_state=int(rng.integers(2**31)))
            noisy = {c: np.maximum(np.rint(table(rows, schema, c) + rng.normal(0, sigma, (len(
                schema.column(c).categories), 2))), 0) for c in CANDIDATES}
            for kind, s in (("plain", 0.0), ("variance-weighted", sigma)):
                scores = {c: noise_aware_cramers_v(noisy[c], s, debias=s > 0) for c in CANDIDATES}
                picks[kind][max(CANDIDATES, key=scores.get) if max(scores.values()) > 0 else None] += 1
        print(f"epsilon {epsilon:g} (noise sd {sigma:.1f}), {args.draws} draws of {args.rows} rows:",
              {kind: dict(c) for kind, c in picks.items()})


if __name__ == "__main__":
    main()
