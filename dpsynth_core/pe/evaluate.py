"""Utility of a synthetic set: downstream classifier (train on synthetic, test on real held-out),
FID and MAUVE between embeddings of synthetic and real texts."""

from __future__ import annotations

import numpy as np
from scipy import linalg


def downstream_accuracy(train_emb: np.ndarray, train_labels: list[str], test_emb: np.ndarray,
                        test_labels: list[str], seed: int = 0) -> float:
    """Logistic regression on (MiniLM) embeddings trained on ``train``, accuracy on ``test``.
    A training set with one class predicts that class everywhere."""
    from sklearn.linear_model import LogisticRegression

    if len(set(train_labels)) < 2:
        only = train_labels[0] if train_labels else None
        return float(np.mean([y == only for y in test_labels]))
    clf = LogisticRegression(max_iter=2000, C=10.0, random_state=seed)
    clf.fit(train_emb, train_labels)
    return float(np.mean(clf.predict(test_emb) == np.asarray(test_labels, dtype=object)))


def frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """FID between two embedding clouds (Gaussian fit of each)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    mu_a, mu_b = a.mean(0), b.mean(0)
    ca, cb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
    covmean, _ = linalg.sqrtm(ca @ cb, disp=False)
    if not np.isfinite(covmean).all():  # near-singular: regularise
        off = np.eye(ca.shape[0]) * 1e-6
        covmean = linalg.sqrtm((ca + off) @ (cb + off))
    covmean = np.real(covmean)
    return float(((mu_a - mu_b) ** 2).sum() + np.trace(ca) + np.trace(cb) - 2.0 * np.trace(covmean))


def mauve_score(p_emb: np.ndarray, q_emb: np.ndarray, seed: int = 0) -> float:
    """MAUVE (mauve-text) computed on precomputed embeddings (``p_features`` / ``q_features``)."""
    import mauve

    n = min(len(p_emb), len(q_emb))
    clusters = max(2, min(n // 10, 50))
    out = mauve.compute_mauve(p_features=np.asarray(p_emb), q_features=np.asarray(q_emb), num_buckets=clusters,
                              seed=seed, verbose=False)
    return float(out.mauve)


def evaluate_synthetic(synth_emb: np.ndarray, synth_labels: list[str], test_emb: np.ndarray,
                       test_labels: list[str], *, with_mauve: bool = True, seed: int = 0) -> dict:
    """All metrics of one synthetic set against the real held-out set."""
    from dpsynth_core.data.sample_sizes import enough_for_mauve, majority_accuracy, mauve_not_enough

    out = {
        "n_train": int(len(synth_labels)),
        "n_test": int(len(test_labels)),
        "accuracy": downstream_accuracy(synth_emb, synth_labels, test_emb, test_labels, seed),
        "majority_baseline": majority_accuracy(list(test_labels)),  # the trivial baseline beside accuracy
        "fid": frechet_distance(synth_emb, test_emb) if len(synth_emb) > 1 else float("nan"),
    }
    if with_mauve and not enough_for_mauve(len(test_emb), len(synth_emb)):
        gate = mauve_not_enough(len(test_emb), len(synth_emb))
        out.update(mauve=None, mauve_status=gate["status"], mauve_min_texts=gate["min_texts"])
    elif with_mauve:
        try:
            out["mauve"] = mauve_score(synth_emb, test_emb, seed)
        except Exception as exc:  # MAUVE needs enough points; report why it is missing
            out["mauve"] = None
            out["mauve_error"] = type(exc).__name__
    return out
