"""Evaluation of synthetic text: IFAcc, MAUVE, downstream classifier, length/repetition, plots.

    emb = load_embedder("minilm")
    mauve_score(real_heldout, synthetic, embedder=emb)
    downstream_classifier(synth_texts, synth_labels, real_texts, real_labels, embedder=emb)
    length_stats(texts); distinct_n(texts, 2)

Evaluation reads held-out real texts; like every utility benchmark it sits outside the privacy
guarantee (its numbers are for the researcher, not released with the data) and it never logs a
text. Only aggregate numbers and plots of aggregates come out.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Sequence

import numpy as np

from dpsynth_core.data.sample_sizes import constant_macro_f1, enough_for_mauve, mauve_not_enough
from dpsynth_core.errors import DataError


def _embed(texts: Sequence[str], embedder) -> np.ndarray:
    if embedder is None or isinstance(embedder, str):
        from dpsynth_core.models import load_embedder

        embedder = load_embedder(embedder or "minilm")
    return embedder.encode(list(texts))


# ---------------------------------------------------------------------------------------------
# IFAcc
# ---------------------------------------------------------------------------------------------
def ifacc_summary(scores: Sequence[float]) -> dict:
    """Mean, std, fraction fully correct and count of per-text IFAcc scores."""
    arr = np.asarray(list(scores), dtype=float)
    if arr.size == 0:
        return {"mean": float("nan"), "std": float("nan"), "frac_perfect": float("nan"), "n": 0}
    return {"mean": float(arr.mean()), "std": float(arr.std()),
            "frac_perfect": float(np.mean(arr >= 1.0 - 1e-12)), "n": int(arr.size)}


def per_field_accuracy(extracted: Sequence[dict], targets: Sequence[dict], fields: Sequence[str]) -> dict:
    """Agreement per field and its mean (extractor vs oracle, or extracted vs requested)."""
    if len(extracted) != len(targets):
        raise DataError(f"per_field_accuracy: {len(extracted)} rows vs {len(targets)} targets")
    per = {f: float(np.mean([e.get(f) == t.get(f) for e, t in zip(extracted, targets)])) for f in fields}
    return {"per_field": per, "mean": float(np.mean(list(per.values())))}


# ---------------------------------------------------------------------------------------------
# MAUVE
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _quiet_kmeans():
    """faiss prints "WARNING clustering N points to K centroids: please provide at least ..." to the C
    stderr whenever N < 39 K, i.e. for every MAUVE on a few hundred texts; nothing a user can act on.
    ``min_points_per_centroid`` only gates that message (faiss subsamples on the max, not the min),
    so the clustering is unchanged. mauve builds its own faiss.Kmeans, hence the swap while it runs."""
    import importlib

    import faiss

    # the module, not the function of the same name that ``mauve`` re-exports
    mauve_module = importlib.import_module("mauve.compute_mauve")

    class QuietKmeans(faiss.Kmeans):
        def __init__(self, d, k, **kwargs):
            super().__init__(d, k, **{"min_points_per_centroid": 1, **kwargs})

    mauve_module.faiss = SimpleNamespace(Kmeans=QuietKmeans)
    try:
        yield
    finally:
        mauve_module.faiss = faiss


def mauve_score(real_texts: Sequence[str], synth_texts: Sequence[str], *, embedder=None,
                num_buckets: int | str = "auto", seed: int = 25, **kwargs) -> dict:
    """MAUVE (mauve-text) between real (p) and synthetic (q) texts on MiniLM embeddings.
    ``num_buckets="auto"`` uses max(2, min(n/10, 50)) clusters. Returns
    ``{"mauve", "n_real", "n_synthetic", "num_buckets"}``."""
    import mauve

    if len(real_texts) < 2 or len(synth_texts) < 2:
        raise DataError("MAUVE needs at least 2 real and 2 synthetic texts")
    p = _embed(real_texts, embedder)
    q = _embed(synth_texts, embedder)
    if num_buckets == "auto":
        num_buckets = int(max(2, min(min(len(p), len(q)) // 10, 50)))
    with _quiet_kmeans():
        out = mauve.compute_mauve(p_features=p, q_features=q, num_buckets=num_buckets, seed=seed,
                                  verbose=False, **kwargs)
    return {"mauve": float(out.mauve), "n_real": len(p), "n_synthetic": len(q), "num_buckets": int(num_buckets)}


# ---------------------------------------------------------------------------------------------
# Downstream classifier (train on synthetic, test on real)
# ---------------------------------------------------------------------------------------------
def downstream_classifier(train_texts: Sequence[str], train_labels: Sequence[str],
                          test_texts: Sequence[str], test_labels: Sequence[str], *,
                          embedder=None, max_iter: int = 2000, seed: int = 0) -> dict:
    """Logistic regression on MiniLM embeddings, trained on ``train_*`` (synthetic) and tested
    on ``test_*`` (real held-out). Returns accuracy, macro-F1, the majority-class baseline of
    the test set, and the class counts. With one training class it predicts that class."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    if len(train_texts) != len(train_labels) or len(test_texts) != len(test_labels):
        raise DataError("downstream_classifier: texts and labels differ in length")
    if not train_texts or not test_texts:
        raise DataError("downstream_classifier: empty train or test set")
    x_train, x_test = _embed(train_texts, embedder), _embed(test_texts, embedder)
    y_train, y_test = np.asarray(train_labels, dtype=object), np.asarray(test_labels, dtype=object)
    classes = sorted(set(y_train))
    if len(classes) == 1:
        pred = np.full(len(y_test), classes[0], dtype=object)
    else:
        clf = LogisticRegression(max_iter=max_iter, random_state=seed)
        clf.fit(x_train, y_train)
        pred = clf.predict(x_test)
    majority = Counter(y_test).most_common(1)[0][1] / len(y_test)
    return {
        "accuracy": float(accuracy_score(y_test, pred)),
        "macro_f1": float(f1_score(y_test, pred, average="macro", zero_division=0)),
        "majority_baseline": float(majority),  # beside accuracy
        "constant_macro_f1": float(constant_macro_f1(list(y_test))),  # beside macro-F1 (the same metric)
        "n_train": len(y_train), "n_test": len(y_test),
        "n_train_classes": len(classes), "n_test_classes": len(set(y_test)),
    }


# ---------------------------------------------------------------------------------------------
# Length and repetition
# ---------------------------------------------------------------------------------------------
def _words(text: str) -> list[str]:
    return text.lower().split()


def length_stats(texts: Sequence[str]) -> dict:
    """Length in words and characters: mean, std, median, min, max; fraction of empty texts."""
    words = np.array([len(_words(t)) for t in texts], dtype=float)
    chars = np.array([len(t) for t in texts], dtype=float)
    if words.size == 0:
        return {"n": 0}
    return {"n": int(words.size), "mean_words": float(words.mean()), "std_words": float(words.std()),
            "median_words": float(np.median(words)), "min_words": int(words.min()),
            "max_words": int(words.max()), "mean_chars": float(chars.mean()),
            "frac_empty": float(np.mean(words == 0))}


def distinct_n(texts: Sequence[str], n: int = 2) -> float:
    """Distinct-n over the corpus: unique n-grams / total n-grams (1.0 = no repetition)."""
    total, unique = 0, set()
    for t in texts:
        w = _words(t)
        grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
        total += len(grams)
        unique.update(grams)
    return float(len(unique) / total) if total else 0.0


def repetition_rate(texts: Sequence[str], n: int = 3) -> float:
    """Mean within-text fraction of repeated n-grams (degenerate loops score high)."""
    rates = []
    for t in texts:
        w = _words(t)
        grams = [tuple(w[i : i + n]) for i in range(len(w) - n + 1)]
        if grams:
            rates.append(1.0 - len(set(grams)) / len(grams))
    return float(np.mean(rates)) if rates else 0.0


def text_stats(texts: Sequence[str]) -> dict:
    """Length statistics plus distinct-1/2/3 and the within-text 3-gram repetition rate."""
    return {**length_stats(texts), "distinct_1": distinct_n(texts, 1), "distinct_2": distinct_n(texts, 2),
            "distinct_3": distinct_n(texts, 3), "repetition_3": repetition_rate(texts, 3),
            "duplicate_frac": float(1 - len(set(texts)) / len(texts)) if texts else 0.0}


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, Agg), written atomically
# ---------------------------------------------------------------------------------------------
def _save_figure(fig, path: str | Path) -> Path:
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=path.suffix or ".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        Path(tmp).unlink(missing_ok=True)
    return path


def plot_length_histograms(real_texts: Sequence[str], synth_texts: Sequence[str], path: str | Path,
                           title: str = "Text length (words)") -> Path:
    """Overlaid, density-normalised histograms of word counts, real vs synthetic."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    real = [len(_words(t)) for t in real_texts]
    synth = [len(_words(t)) for t in synth_texts]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    hi = max(real + synth + [1])
    bins = np.linspace(0, hi, 30)
    ax.hist(real, bins=bins, alpha=0.55, density=True, label=f"real (n={len(real)})")
    ax.hist(synth, bins=bins, alpha=0.55, density=True, label=f"synthetic (n={len(synth)})")
    ax.set_xlabel("words per text")
    ax.set_ylabel("density")
    ax.set_title(title)
    ax.legend()
    return _save_figure(fig, path)


def plot_marginal_djs(djs: dict, path: str | Path, title: str | None = None) -> Path:
    """Horizontal bars of per-marginal JS distance (the output of ``features.marginal_djs``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per = djs["per_marginal"]
    names = sorted(per, key=per.get)
    height = max(2.5, 0.25 * len(names) + 1)
    fig, ax = plt.subplots(figsize=(7, min(height, 14)))
    ax.barh(range(len(names)), [per[n] for n in names], color="tab:blue")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names if len(names) <= 40 else [""] * len(names), fontsize=7)
    ax.axvline(djs["mean"], color="tab:red", linestyle="--", label=f"mean {djs['mean']:.3f}")
    ax.set_xlim(0, float(np.sqrt(np.log(2))))
    ax.set_xlabel("Jensen-Shannon distance (base e, scipy's default)")
    ax.set_title(title or f"{djs['order']}-way marginals: real vs synthetic")
    ax.legend(loc="lower right")
    return _save_figure(fig, path)


def evaluate_texts(synth_texts: Sequence[str], real_texts: Sequence[str], *, embedder=None,
                   synth_labels: Sequence[str] | None = None, real_labels: Sequence[str] | None = None,
                   ifacc: Sequence[float] | None = None, plots_dir: str | Path | None = None) -> dict:
    """All text metrics at once (what the ACTG driver puts in metrics.json). ``real_texts`` must be
    held out from training. Plots go to ``plots_dir`` if given."""
    if embedder is None or isinstance(embedder, str):
        from dpsynth_core.models import load_embedder

        embedder = load_embedder(embedder or "minilm")
    metrics: dict = {"synthetic": text_stats(synth_texts), "real": text_stats(real_texts)}
    metrics["mauve"] = (mauve_score(real_texts, synth_texts, embedder=embedder)
                        if enough_for_mauve(len(real_texts), len(synth_texts))
                        else mauve_not_enough(len(real_texts), len(synth_texts)))
    if synth_labels is not None and real_labels is not None:
        metrics["downstream"] = downstream_classifier(synth_texts, synth_labels, real_texts, real_labels,
                                                      embedder=embedder)
    if ifacc is not None:
        metrics["ifacc"] = ifacc_summary(ifacc)
    if plots_dir is not None:
        metrics["plots"] = [str(plot_length_histograms(real_texts, synth_texts, Path(plots_dir) / "lengths.png"))]
    return metrics
