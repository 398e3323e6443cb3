"""Evaluate a synthetic table against real data: fidelity, utility (TSTR), fairness, privacy.

* fidelity: mean total-variation distance of 1-way and 2-way marginals (numeric columns binned
  into 10 equal-width bins over the *schema* bounds);
* utility: TSTR — train on synthetic, test on real held-out data — with logistic regression and
  gradient boosting (accuracy, F1 of the positive label);
* fairness of those classifiers on the real test set: fairlearn demographic_parity_difference
  and equalized_odds_difference w.r.t. each sensitive attribute;
* privacy: distance to closest record (synthetic -> train vs holdout -> train) and a DCR
  membership-inference attack (members = train rows, non-members = holdout rows, score =
  -distance to the nearest synthetic row; AUC 0.5 = no signal).

This is an offline evaluation: it reads the private training data and its output (aggregate
numbers only) is for the data owner, not a DP release.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from dpsynth_core.data.sample_sizes import constant_f1_positive, constant_macro_f1, majority_accuracy
from dpsynth_core.errors import DataError
from dpsynth_core.tabular.schema import TableSchema

N_BINS = 10


def _binned(df: pd.DataFrame, schema: TableSchema) -> pd.DataFrame:
    out = pd.DataFrame(index=df.index)
    for col in schema.columns:
        if col.is_categorical:
            out[col.name] = df[col.name].astype(str)
        else:
            edges = np.linspace(float(col.min), float(col.max), N_BINS + 1)
            out[col.name] = np.clip(np.searchsorted(edges, pd.to_numeric(df[col.name]), side="right") - 1, 0, N_BINS - 1)
    return out


def _tvd(a: pd.Series, b: pd.Series) -> float:
    pa, pb = a.value_counts(normalize=True), b.value_counts(normalize=True)
    keys = pa.index.union(pb.index)
    return 0.5 * float(np.abs(pa.reindex(keys, fill_value=0) - pb.reindex(keys, fill_value=0)).sum())


def _jsd(a: pd.Series, b: pd.Series) -> float:
    """Jensen-Shannon divergence (base 2, in [0, 1]) of two empirical distributions."""
    pa, pb = a.value_counts(normalize=True), b.value_counts(normalize=True)
    keys = pa.index.union(pb.index)
    p, q = pa.reindex(keys, fill_value=0).to_numpy(), pb.reindex(keys, fill_value=0).to_numpy()
    m = 0.5 * (p + q)

    def kl(x: np.ndarray) -> float:
        nz = x > 0
        return float(np.sum(x[nz] * np.log2(x[nz] / m[nz])))

    return 0.5 * kl(p) + 0.5 * kl(q)


def marginal_tvd(synth: pd.DataFrame, real: pd.DataFrame, schema: TableSchema) -> dict:
    """1-way and 2-way marginals: TVD and Jensen-Shannon divergence per column / pair, and their means."""
    s, r = _binned(synth, schema), _binned(real, schema)
    one = {c: _tvd(s[c], r[c]) for c in schema.names}
    jsd_one = {c: _jsd(s[c], r[c]) for c in schema.names}
    two, jsd_two = {}, {}
    for a, b in itertools.combinations(schema.names, 2):
        sa, ra = s[a].astype(str) + "\x1f" + s[b].astype(str), r[a].astype(str) + "\x1f" + r[b].astype(str)
        two[f"{a}|{b}"], jsd_two[f"{a}|{b}"] = _tvd(sa, ra), _jsd(sa, ra)
    return {"tvd_1way_mean": float(np.mean(list(one.values()))), "tvd_2way_mean": float(np.mean(list(two.values()))),
            "jsd_1way_mean": float(np.mean(list(jsd_one.values()))), "jsd_2way_mean": float(np.mean(list(jsd_two.values()))),
            "tvd_1way": one, "tvd_2way": two, "jsd_1way": jsd_one, "jsd_2way": jsd_two}


def column_shares(synth: pd.DataFrame, real: pd.DataFrame, schema: TableSchema) -> dict:
    """Each column's distribution (shares per category / schema bin), real beside synthetic: the report's plot
    per column (aggregates over at least the table's rows, owner-side like every figure here)."""
    s, r = _binned(synth, schema), _binned(real, schema)
    out = {}
    for c in schema.names:
        ps, pr = s[c].value_counts(normalize=True), r[c].value_counts(normalize=True)
        keys = sorted(pr.index.union(ps.index), key=str)
        out[c] = {"values": [k if isinstance(k, str) else int(k) for k in keys],
                  "real": [float(pr.get(k, 0.0)) for k in keys], "synthetic": [float(ps.get(k, 0.0)) for k in keys]}
    return out


def associations(synth: pd.DataFrame, real: pd.DataFrame, schema: TableSchema) -> dict:
    """Cramér's V of every column pair (numeric columns in their schema bins), real and synthetic: the report's
    correlation heatmaps (0 = independent, 1 = one column determines the other)."""
    from scipy.stats import chi2_contingency

    def matrix(binned: pd.DataFrame) -> list[list[float]]:
        names = schema.names
        out = [[1.0 if i == j else 0.0 for j in range(len(names))] for i in range(len(names))]
        for i, j in itertools.combinations(range(len(names)), 2):
            table = pd.crosstab(binned[names[i]].astype(str), binned[names[j]].astype(str))
            k = min(table.shape) - 1
            if k > 0:
                chi2 = chi2_contingency(table, correction=False)[0]
                out[i][j] = out[j][i] = float(np.sqrt(chi2 / (table.to_numpy().sum() * k)))
        return out

    return {"columns": list(schema.names), "real": matrix(_binned(real, schema)),
            "synthetic": matrix(_binned(synth, schema))}


def encode_matrix(df: pd.DataFrame, schema: TableSchema, exclude: tuple[str, ...] = ()) -> np.ndarray:
    """Dense features: one-hot over the *public* categories, numbers min-max scaled by schema bounds.

    The encoding is fixed by the schema, so it leaks nothing about any data set.
    """
    blocks = []
    for col in schema.columns:
        if col.name in exclude:
            continue
        if col.is_categorical:
            cats = pd.Categorical(df[col.name].astype(str), categories=col.categories)
            blocks.append(np.eye(len(col.categories))[cats.codes].astype(float) * (cats.codes >= 0)[:, None])
        else:
            lo, hi = float(col.min), float(col.max)
            x = (pd.to_numeric(df[col.name]).to_numpy(float) - lo) / max(hi - lo, 1e-12)
            blocks.append(np.clip(x, 0, 1)[:, None])
    return np.hstack(blocks) if blocks else np.zeros((len(df), 0))


def tstr_predictions(synth: pd.DataFrame, real_test: pd.DataFrame, schema: TableSchema,
                     seed: int = 0) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """TSTR's classifiers (LR, gradient boosting) trained on ``synth``: the test rows' true labels and each model's
    predictions, both coded as :func:`tstr` scores them (binary: 1 = the positive label; else class indices)."""
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.linear_model import LogisticRegression

    if schema.target is None:
        raise DataError(f"schema '{schema.name}': TSTR needs a target column")
    classes = list(schema.column(schema.target).categories or [])
    binary = len(classes) <= 2
    if binary:
        pos = schema.positive()
        y_tr = (synth[schema.target] == pos).astype(int).to_numpy()
        y_te = (real_test[schema.target] == pos).astype(int).to_numpy()
    else:
        codes = {c: i for i, c in enumerate(classes)}
        y_tr = synth[schema.target].astype(str).map(codes).fillna(-1).astype(int).to_numpy()
        y_te = real_test[schema.target].astype(str).map(codes).fillna(-1).astype(int).to_numpy()
    X_tr = encode_matrix(synth, schema, (schema.target,))
    X_te = encode_matrix(real_test, schema, (schema.target,))
    models = {
        "logreg": lambda: LogisticRegression(max_iter=2000),
        "gboost": lambda: HistGradientBoostingClassifier(random_state=seed, max_iter=200),
    }
    predictions = {}
    for name, make in models.items():
        if len(np.unique(y_tr)) < 2:
            predictions[name] = np.full(len(y_te), int(y_tr[0]) if len(y_tr) else 0)  # one class only: constant
        else:
            clf = make()
            clf.fit(X_tr, y_tr)
            predictions[name] = clf.predict(X_te)
    return y_te, predictions


def tstr(synth: pd.DataFrame, real_test: pd.DataFrame, schema: TableSchema, seed: int = 0) -> dict:
    """Train LR and gradient boosting on ``synth``, test on ``real_test``; accuracy, F1, fairness.

    A binary target: F1 of the positive label, fairlearn's demographic-parity and equalized-odds
    differences. A multi-class target: macro F1, and each gap the largest over the classes taken
    one-vs-rest (the class whose rate differs most between groups)."""
    from fairlearn.metrics import demographic_parity_difference, equalized_odds_difference
    from sklearn.metrics import accuracy_score, f1_score

    y_te, predictions = tstr_predictions(synth, real_test, schema, seed)
    classes = list(schema.column(schema.target).categories or [])
    binary = len(classes) <= 2
    one_vs_rest = [(y_te == 1, None)] if binary else [(y_te == k, k) for k in range(len(classes))]
    results = {}
    for name, pred in predictions.items():
        f1 = f1_score(y_te, pred, zero_division=0) if binary else f1_score(y_te, pred, average="macro", zero_division=0)
        res = {"accuracy": float(accuracy_score(y_te, pred)), "f1": float(f1)}
        for a in schema.sensitive:
            sf = real_test[a].astype(str)
            dp, eo = [], []
            for truth, k in one_vs_rest:
                hit = (pred == 1) if k is None else (pred == k)
                dp.append(demographic_parity_difference(truth.astype(int), hit.astype(int), sensitive_features=sf))
                eo.append(equalized_odds_difference(truth.astype(int), hit.astype(int), sensitive_features=sf))
            res[f"dp_diff_{a}"], res[f"eo_diff_{a}"] = float(np.nanmax(dp)), float(np.nanmax(eo))
        results[name] = res
    # the trivial baselines on the same metrics and test rows (docs/report.md): every TSTR figure is shown beside them
    results["baseline"] = {"majority_accuracy": majority_accuracy(list(y_te)), "n_test": int(len(y_te)),
                           "constant_f1": constant_f1_positive(list(y_te)) if binary else constant_macro_f1(list(y_te))}
    return results


def privacy_metrics(synth: pd.DataFrame, train: pd.DataFrame, holdout: pd.DataFrame, schema: TableSchema, seed: int = 0) -> dict:
    """DCR of synthetic and holdout rows to the training rows, and a DCR membership-inference AUC."""
    from sklearn.metrics import roc_auc_score
    from sklearn.neighbors import NearestNeighbors

    n = min(len(train), len(holdout))
    rng = np.random.default_rng(seed)
    tr = train.iloc[rng.permutation(len(train))[:n]]
    ho = holdout.iloc[rng.permutation(len(holdout))[:n]]
    X_tr, X_ho, X_sy = encode_matrix(tr, schema), encode_matrix(ho, schema), encode_matrix(synth, schema)
    nn_train = NearestNeighbors(n_neighbors=1).fit(X_tr)
    dcr_synth = nn_train.kneighbors(X_sy)[0][:, 0]
    # holdout baseline: a fresh real sample is as close to train as an ideal generator's rows
    dcr_holdout = nn_train.kneighbors(X_ho)[0][:, 0]
    nn_syn = NearestNeighbors(n_neighbors=1).fit(X_sy)
    d_mem, d_non = nn_syn.kneighbors(X_tr)[0][:, 0], nn_syn.kneighbors(X_ho)[0][:, 0]
    scores = -np.concatenate([d_mem, d_non])
    labels = np.concatenate([np.ones(len(d_mem)), np.zeros(len(d_non))])
    return {
        "n_members": int(n), "n_synthetic": int(len(synth)),
        "dcr_synth_median": float(np.median(dcr_synth)),
        "dcr_holdout_median": float(np.median(dcr_holdout)),
        "dcr_synth_exact_match_rate": float(np.mean(dcr_synth < 1e-9)),
        "dcr_holdout_exact_match_rate": float(np.mean(dcr_holdout < 1e-9)),
        "mia_auc": float(roc_auc_score(labels, scores)),
        "dcr_synth": dcr_synth.tolist(),
        "dcr_holdout": dcr_holdout.tolist(),
    }


def attribute_inference(synth: pd.DataFrame, train: pd.DataFrame, holdout: pd.DataFrame, schema: TableSchema,
                        sensitive: str, seed: int = 0) -> dict:
    """Attribute-inference attack: knowing every other column of a person, guess their ``sensitive``
    value as that of the nearest synthetic row. Accuracy on training rows (members) vs held-out rows
    (non-members): the advantage is what the synthetic table gives away about its training rows
    beyond what it teaches about the population (0 = nothing)."""
    from sklearn.neighbors import NearestNeighbors

    n = min(len(train), len(holdout))
    rng = np.random.default_rng(seed)
    tr = train.iloc[rng.permutation(len(train))[:n]]
    ho = holdout.iloc[rng.permutation(len(holdout))[:n]]
    nn = NearestNeighbors(n_neighbors=1).fit(encode_matrix(synth, schema, (sensitive,)))
    guess = synth[sensitive].astype(str).to_numpy()

    def accuracy(rows: pd.DataFrame) -> float:
        idx = nn.kneighbors(encode_matrix(rows, schema, (sensitive,)))[1][:, 0]
        return float(np.mean(guess[idx] == rows[sensitive].astype(str).to_numpy()))

    member, non_member = accuracy(tr), accuracy(ho)
    majority = float(ho[sensitive].astype(str).value_counts(normalize=True).iloc[0]) if len(ho) else float("nan")
    return {"member_accuracy": member, "non_member_accuracy": non_member, "advantage": member - non_member,
            "majority_rate": majority}


def plot_report(synth: pd.DataFrame, real: pd.DataFrame, schema: TableSchema, report: dict, out_dir: Path) -> list[Path]:
    """PNG plots: 1-way TVD per column, a few marginals side by side, DCR histograms."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(8, 3.5))
    one = report["fidelity"]["tvd_1way"]
    ax.bar(list(one), list(one.values()))
    ax.set_ylabel("TVD (1-way)")
    ax.tick_params(axis="x", rotation=60)
    fig.tight_layout()
    paths.append(out_dir / "tvd_1way.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    s, r = _binned(synth, schema), _binned(real, schema)
    cols = schema.names[:6]
    fig, axes = plt.subplots(2, 3, figsize=(12, 6))
    for ax, c in zip(axes.ravel(), cols):
        ps, pr = s[c].value_counts(normalize=True), r[c].value_counts(normalize=True)
        keys = list(pr.index.union(ps.index))
        x = np.arange(len(keys))
        ax.bar(x - 0.2, pr.reindex(keys, fill_value=0), 0.4, label="real")
        ax.bar(x + 0.2, ps.reindex(keys, fill_value=0), 0.4, label="synthetic")
        ax.set_xticks(x, [str(k)[:10] for k in keys], rotation=70, fontsize=7)
        ax.set_title(c)
    axes.ravel()[0].legend()
    fig.tight_layout()
    paths.append(out_dir / "marginals.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    if "privacy" in report:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.hist(report["privacy"]["dcr_holdout"], bins=40, alpha=0.6, label="holdout -> train")
        ax.hist(report["privacy"]["dcr_synth"], bins=40, alpha=0.6, label="synthetic -> train")
        ax.set_xlabel("distance to closest training record")
        ax.legend()
        fig.tight_layout()
        paths.append(out_dir / "dcr.png")
        fig.savefig(paths[-1], dpi=100)
        plt.close(fig)
    return paths


def evaluate_table(
    synth: pd.DataFrame,
    real_train: pd.DataFrame,
    real_test: pd.DataFrame,
    schema: TableSchema,
    *,
    out_dir: Path | None = None,
    seed: int = 0,
    privacy: bool = True,
) -> dict:
    """Full report (dict); writes ``report.json`` and PNGs into ``out_dir`` when given."""
    synth = schema.validate_frame(synth, "synthetic")
    real_train = schema.validate_frame(real_train, "real train")
    real_test = schema.validate_frame(real_test, "real test")
    report: dict = {"n_synthetic": len(synth), "n_real_train": len(real_train), "n_real_test": len(real_test),
                    "fidelity": marginal_tvd(synth, real_train, schema)}
    report["marginals"] = column_shares(synth, real_train, schema)
    report["associations"] = associations(synth, real_train, schema)
    if schema.target is not None:
        report["tstr"] = tstr(synth, real_test, schema, seed)
    if privacy:
        report["privacy"] = privacy_metrics(synth, real_train, real_test, schema, seed)
        for a in schema.sensitive:
            report["privacy"][f"attribute_inference_{a}"] = attribute_inference(synth, real_train, real_test, schema, a, seed)
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        report["plots"] = [str(p) for p in plot_report(synth, real_train, schema, report, out_dir)]
        summary = {k: v for k, v in report.items() if k != "privacy"}
        if privacy:
            summary["privacy"] = {k: v for k, v in report["privacy"].items() if not isinstance(v, list)}
        tmp = out_dir / "report.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2))
        tmp.replace(out_dir / "report.json")
    return report


def summary_row(report: dict, sensitive: str) -> dict:
    """The headline numbers of a report (for tables)."""
    lr, gb = report["tstr"]["logreg"], report["tstr"]["gboost"]
    return {
        "n_synthetic": report.get("n_synthetic"), "n_test": report["tstr"].get("baseline", {}).get("n_test"),
        "majority_acc": report["tstr"].get("baseline", {}).get("majority_accuracy"),
        "constant_f1": report["tstr"].get("baseline", {}).get("constant_f1"),
        "acc_lr": lr["accuracy"], "f1_lr": lr["f1"], "acc_gb": gb["accuracy"], "f1_gb": gb["f1"],
        "dp_diff_lr": lr[f"dp_diff_{sensitive}"], "eo_diff_lr": lr[f"eo_diff_{sensitive}"],
        "dp_diff_gb": gb[f"dp_diff_{sensitive}"], "eo_diff_gb": gb[f"eo_diff_{sensitive}"],
        "tvd_1way": report["fidelity"]["tvd_1way_mean"], "tvd_2way": report["fidelity"]["tvd_2way_mean"],
        "jsd_1way": report["fidelity"].get("jsd_1way_mean"), "jsd_2way": report["fidelity"].get("jsd_2way_mean"),
        "mia_auc": report.get("privacy", {}).get("mia_auc", float("nan")),
        "aia_advantage": report.get("privacy", {}).get(f"attribute_inference_{sensitive}", {}).get("advantage"),
        # every sensitive attribute of the schema, not only the headline one
        **{f"{k}_{m}_{a}": res[f"{k}_{a}"] for m, res in (("lr", lr), ("gb", gb))
           for k in ("dp_diff", "eo_diff") for a in sorted({key.split("_", 2)[2] for key in res if key.startswith("dp_diff_")})},
        **{f"aia_advantage_{key.removeprefix('attribute_inference_')}": v["advantage"]
           for key, v in report.get("privacy", {}).items() if key.startswith("attribute_inference_")},
    }
