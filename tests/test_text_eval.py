"""Text evaluation: IFAcc summary, MAUVE on MiniLM features, downstream classifier, length and
repetition statistics, plots."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpsynth_core.actg import text_eval as te
from dpsynth_core.errors import DataError


@pytest.fixture(scope="module")
def embedder():
    """MiniLM behind the evaluate stage's own cache (``evaluation.CachedEmbedder``): these tests embed the same
    abstracts again and again (MAUVE over three k-means seeds, both halves of the corpus in several tests)."""
    from dpsynth_core.actg.evaluation import CachedEmbedder
    from dpsynth_core.models import load_embedder

    return CachedEmbedder(load_embedder("minilm"))


@pytest.fixture(scope="module")
def corpus(biorxiv_csv):
    df = pd.read_csv(biorxiv_csv, usecols=["abstract", "category"])
    df = df[df.category.isin(["neuroscience", "plant biology", "immunology"])].groupby("category").head(30)
    return df.sample(frac=1.0, random_state=0).reset_index(drop=True)


def test_ifacc_summary_and_per_field():
    s = te.ifacc_summary([1.0, 0.5, 1.0, 0.0])
    assert s == {"mean": 0.625, "std": pytest.approx(np.std([1, 0.5, 1, 0])), "frac_perfect": 0.5, "n": 4}
    assert te.ifacc_summary([])["n"] == 0
    acc = te.per_field_accuracy([{"a": "x", "b": "y"}, {"a": "x", "b": "z"}], [{"a": "x", "b": "y"}] * 2, ["a", "b"])
    assert acc == {"per_field": {"a": 1.0, "b": 0.5}, "mean": 0.75}


def test_length_and_repetition():
    texts = ["the cat sat on the mat", "a b a b a b a b", ""]
    ls = te.length_stats(texts)
    assert ls["n"] == 3 and ls["mean_words"] == pytest.approx(14 / 3) and ls["frac_empty"] == pytest.approx(1 / 3)
    assert te.distinct_n(["a b c d"], 2) == 1.0
    assert te.distinct_n(["a b a b a b"], 2) == pytest.approx(2 / 5)
    assert te.repetition_rate(["a b a b a b a b"], 3) > 0.5 > te.repetition_rate(["one two three four five"], 3)
    st = te.text_stats(["x y z", "x y z"])
    assert st["duplicate_frac"] == 0.5 and "distinct_2" in st


def test_mauve_separates_real_from_degenerate(corpus, embedder):
    real = corpus.abstract.tolist()
    a, b = real[: len(real) // 2], real[len(real) // 2:]
    junk = [f"buy cheap watches online now {i} discount offer" for i in range(40)]
    close = te.mauve_score(a, b, embedder=embedder, num_buckets=4)
    far = te.mauve_score(a, junk, embedder=embedder, num_buckets=4)
    assert 0 < far["mauve"] < close["mauve"] <= 1.0
    assert close["n_real"] == len(a) and far["num_buckets"] == 4
    with pytest.raises(DataError):
        te.mauve_score(a[:1], b, embedder=embedder)


def test_mauve_on_few_texts_prints_no_faiss_notice_and_scores_as_mauve_does(capfd):
    """faiss warns on the C stderr below 39 points per bucket (every MAUVE of a few hundred texts); the
    quiet k-means gives the same score and leaves mauve's module as it was."""
    import importlib

    import faiss
    import mauve

    rng = np.random.default_rng(0)  # test vectors, not DP randomness
    vectors = {f"t{i}": v for i, v in enumerate(rng.normal(size=(200, 16)).astype(np.float32))}

    class Lookup:
        def encode(self, texts, **kwargs):
            return np.stack([vectors[t] for t in texts])

    real, synth = [f"t{i}" for i in range(100)], [f"t{i}" for i in range(100, 200)]
    capfd.readouterr()
    quiet = te.mauve_score(real, synth, embedder=Lookup(), num_buckets=20)
    assert "WARNING clustering" not in capfd.readouterr().err
    assert importlib.import_module("mauve.compute_mauve").faiss is faiss
    plain = mauve.compute_mauve(p_features=Lookup().encode(real), q_features=Lookup().encode(synth), num_buckets=20,
                                seed=25, verbose=False)
    assert "WARNING clustering" in capfd.readouterr().err  # the notice this hides is real
    assert quiet["mauve"] == float(plain.mauve)


def test_downstream_classifier_train_on_one_half_test_on_other(corpus, embedder):
    train, test = corpus.iloc[:45], corpus.iloc[45:]
    res = te.downstream_classifier(train.abstract.tolist(), train.category.tolist(),
                                   test.abstract.tolist(), test.category.tolist(), embedder=embedder)
    assert res["n_train"] == 45 and res["n_test"] == len(test) and res["n_train_classes"] == 3
    assert res["accuracy"] > res["majority_baseline"] + 0.2  # MiniLM separates these topics easily
    one = te.downstream_classifier(["x", "y"], ["neuroscience"] * 2, test.abstract.tolist(),
                                   test.category.tolist(), embedder=embedder)
    assert one["accuracy"] == pytest.approx((test.category == "neuroscience").mean())
    with pytest.raises(DataError):
        te.downstream_classifier(["x"], [], ["y"], ["a"], embedder=embedder)


def test_plots_and_evaluate_texts(tmp_path, corpus, embedder):
    real = corpus.abstract.tolist()[:30]
    synth = [" ".join(t.split()[:40]) for t in corpus.abstract.tolist()[30:60]]
    p = te.plot_length_histograms(real, synth, tmp_path / "plots" / "lengths.png")
    assert p.is_file() and p.stat().st_size > 1000
    djs = {"order": 1, "mean": 0.2, "max": 0.3, "per_marginal": {"a": 0.1, "b": 0.3}}
    q = te.plot_marginal_djs(djs, tmp_path / "djs.png")
    assert q.is_file() and q.read_bytes()[:4] == b"\x89PNG"
    m = te.evaluate_texts(synth, real, embedder=embedder, synth_labels=corpus.category.tolist()[30:60],
                          real_labels=corpus.category.tolist()[:30], ifacc=[1.0, 0.5],
                          plots_dir=tmp_path / "p2")
    assert set(m) >= {"synthetic", "real", "mauve", "downstream", "ifacc", "plots"}
    assert m["synthetic"]["max_words"] <= 40 < m["real"]["mean_words"]
    assert not list(tmp_path.rglob(".*.png"))


def test_mauve_with_spread_at_the_minimum_and_not_enough_texts_below(biorxiv_csv, embedder):
    """ACTG's MAUVE over three k-means seeds (mean, sd, each value, counts, buckets) at the measured minimum of
    texts a side; one text fewer and it is "not enough texts", with no number (issue 38)."""
    from dpsynth_core.actg.evaluation import mauve_with_spread
    from dpsynth_core.data.sample_sizes import MAUVE_MIN_TEXTS

    texts = pd.read_csv(biorxiv_csv, usecols=["abstract"]).abstract.str[:300].tolist()
    real, synth = texts[:MAUVE_MIN_TEXTS], texts[MAUVE_MIN_TEXTS: 2 * MAUVE_MIN_TEXTS]
    m = mauve_with_spread(real, synth, embedder)
    assert len(m["values"]) == 3 and m["kmeans_seeds"] == [1, 2, 3] and m["num_buckets"] == MAUVE_MIN_TEXTS // 10
    assert m["n_real"] == m["n_synthetic"] == MAUVE_MIN_TEXTS
    assert m["mauve"] == pytest.approx(np.mean(m["values"])) and 0.5 < m["mauve"] <= 1.0
    assert m["sd_over_kmeans_seeds"] == pytest.approx(np.std(m["values"]))
    few = mauve_with_spread(real, synth[:-1], embedder)
    assert few == {"mauve": None, "status": "not enough texts", "n_real": MAUVE_MIN_TEXTS,
                   "n_synthetic": MAUVE_MIN_TEXTS - 1, "min_texts": MAUVE_MIN_TEXTS}
