"""ACTG as published: oracle columns, a public-data reward, a judge that is not the reward, pools, d_JS."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsynth_core.actg.pipeline import ActgConfig
from dpsynth_core.actg.schema import builtin_schema
from dpsynth_core.errors import DataError


@pytest.fixture(scope="module")
def biorxiv():
    from dpsynth_core.data import load_biorxiv

    return load_biorxiv().head(150).reset_index(drop=True)


@pytest.fixture(scope="module")
def schema():
    return builtin_schema("biorxiv")


def test_columns_extractor_returns_the_oracle_labels(biorxiv, schema):
    from dpsynth_core.actg.supervised import columns_attributes

    rows = columns_attributes(biorxiv, schema)
    assert rows == biorxiv[schema.field_names].to_dict("records")  # the oracle's labels, already options
    with pytest.raises(DataError, match="model_organism"):
        columns_attributes(biorxiv.drop(columns=["model_organism"]), schema)
    with pytest.raises(ValueError, match="cannot score"):
        ActgConfig(extractor={"kind": "columns"})  # the reward must read texts
    with pytest.raises(ValueError, match="public_path"):
        ActgConfig(extractor={"kind": "columns"}, reward={"kind": "supervised"})


def test_reward_model_never_sees_private_rows(biorxiv, schema, tmp_path, monkeypatch):
    """The reward is fitted on the declared-public file only: its rows, the held-out and the private
    rows are disjoint, and rewriting every row of the private file (texts and labels) leaves the
    reward's weights unchanged."""
    from dpsynth_core.actg import data_split
    from dpsynth_core.actg.pipeline import RunDir, open_or_create_ledger
    from dpsynth_core.actg.stages_post import stage_reward_model
    from dpsynth_core.privacy import PrivacyLedger

    public_file = tmp_path / "public.csv"
    biorxiv.tail(16).to_csv(public_file, index=False)  # a separate file, declared public
    private_rows = biorxiv.head(len(biorxiv) - 16)
    cfg = ActgConfig(data={"n_records": 40, "n_eval": 30, "public_path": str(public_file), "max_chars": 200},
                     extractor={"kind": "columns"}, reward={"kind": "supervised"}, features={"n_synthetic": 6})
    frame = {"now": private_rows.copy()}
    monkeypatch.setattr(data_split, "load_frame", lambda c: frame["now"])
    public = data_split.load_public_labeled(cfg)
    private, held, _ = data_split.load_private_split(cfg)
    keys = lambda f: set(f["abstract"])  # noqa: E731
    assert len(public) == 16 and not keys(public) & keys(held) and not keys(public) & keys(private)
    RunDir(tmp_path / "a").schema.parent.mkdir(parents=True)
    schema.save(RunDir(tmp_path / "a").schema)
    open_or_create_ledger(cfg, tmp_path / "a")
    stage_reward_model(cfg, str(tmp_path / "a"))
    # the public file's use is in the ledger, at zero epsilon, beside the charged stages
    (use,) = [e for e in PrivacyLedger.open(tmp_path / "a").entries() if e.stage == "public_labeled_data"]
    assert use.kind == "post_processing" and use.epsilon == 0.0 and use.details["rows"] == 16
    assert "data.public_path" in use.details["what"] and "removed from the private pool" not in use.details["what"]
    # every row of the private file: another text, another label
    poisoned = private_rows.copy()
    poisoned["abstract"] = [f"PRIVATE secret record {i} about kinases" for i in range(len(poisoned))]
    poisoned["primary_research_area"] = "Paleontology"
    frame["now"] = poisoned
    (tmp_path / "b").mkdir()
    schema.save(RunDir(tmp_path / "b").schema)
    open_or_create_ledger(cfg, tmp_path / "b")
    stage_reward_model(cfg, str(tmp_path / "b"))
    a, b = (np.load(tmp_path / d / "reward_model" / "weights.npz") for d in ("a", "b"))
    assert set(a.files) == set(b.files) and all(np.array_equal(a[k], b[k]) for k in a.files)


def test_public_rows_are_never_carved_out_of_the_private_file(biorxiv, tmp_path, monkeypatch):
    """data.n_public without a declared-public file (the old carve-out of private rows) is refused at
    config load, naming the key, exit 2; a public file that shares a record with the private file is
    refused before any DP stage, naming the public file's row and never the text."""
    from typer.testing import CliRunner

    from dpsynth_core.actg import data_split
    from dpsynth.cli.main import _app
    from dpsynth_core.errors import ConfigError

    with pytest.raises(ValueError, match=r"data.n_public without data.public_path"):
        ActgConfig(data={"n_records": 40, "n_public": 16}, extractor={"kind": "columns"}, reward={"kind": "supervised"})
    with pytest.raises(ValueError, match=r"set data.public_path"):
        ActgConfig(extractor={"kind": "columns"}, reward={"kind": "supervised"})
    config = tmp_path / "carve.yaml"
    config.write_text("data: {n_records: 40, n_public: 16}\n")
    result = CliRunner().invoke(_app, ["run", "actg", "--config", str(config), "--check"])
    assert isinstance(result.exception, ConfigError) and "data.n_public" in str(result.exception)
    public_file = tmp_path / "public.csv"
    biorxiv.iloc[[5, 140, 141]].to_csv(public_file, index=False)  # row 1 of it is also a private record
    cfg = ActgConfig(data={"n_records": 40, "n_eval": 30, "public_path": str(public_file)},
                     extractor={"kind": "columns"}, reward={"kind": "supervised"})
    monkeypatch.setattr(data_split, "load_frame", lambda c: biorxiv.head(140))
    with pytest.raises(DataError, match=r"public.csv: column 'abstract', row 1: this record is also in data.path") as err:
        data_split.load_private_split(cfg)
    assert biorxiv["abstract"][5][:30] not in str(err.value)


def test_paper_configs_read_a_declared_public_file_disjoint_from_the_private_file(tmp_path, monkeypatch):
    from dpsynth_core.actg.paper_data import PAPER_DATA_DIR, write_paper_split
    from dpsynth_core.actg.pipeline import load_actg_config
    from dpsynth_core.data import load_biorxiv

    public_file, private_file = write_paper_split(tmp_path / PAPER_DATA_DIR)
    public, private = pd.read_csv(public_file), pd.read_csv(private_file)
    assert 250 <= len(public) <= 300 and not set(public["abstract"]) & set(private["abstract"])
    assert len(public) + len(private) <= len(load_biorxiv()) and len(private) >= 1000
    monkeypatch.chdir(tmp_path)  # the configs' relative paths are read from the current directory
    repo = Path(__file__).resolve().parent.parent
    for path in ("configs/actg_paper", "experiments/configs/actg_paper_eps_inf",
                 "experiments/configs/actg_paper_dpft_features", "experiments/configs/actg_paper_direct_prompt"):
        cfg = load_actg_config(repo / f"{path}.yaml")
        assert cfg.resolved(cfg.data.public_path).resolve() == public_file.resolve()
        assert cfg.resolved(cfg.data.path).resolve() == private_file.resolve()


class KeywordReward:
    """A gameable reward: an attribute counts as present when its option string occurs in the text."""

    def __init__(self, schema):
        self.schema = schema

    def ifacc(self, texts, targets):
        return [float(np.mean([t[f] in x for f in self.schema.field_names])) for x, t in zip(texts, targets)]


def test_judge_is_not_the_reward_and_catches_reward_hacking(biorxiv, schema):
    """Texts that list the requested option strings score 1.0 under a keyword reward; the judge
    (TF-IDF trained on labeled real texts) is not fooled, and real abstracts score well under it."""
    from dpsynth_core.actg.evaluation import system_metrics
    from dpsynth_core.actg.supervised import SupervisedExtractor, columns_attributes

    train, test = biorxiv.iloc[:110], biorxiv.iloc[110:]
    real_rows = columns_attributes(train, schema)
    judge = SupervisedExtractor.fit(train["abstract"].tolist(), real_rows, schema, features="tfidf")
    targets = columns_attributes(test, schema)
    hacked = [" ".join(t.values()) for t in targets]
    common = dict(real_texts=train["abstract"].tolist(), real_rows=real_rows, judge=judge,
                  reward=KeywordReward(schema), emb=None, cats=schema.categories(), fields=schema.field_names,
                  label_field="primary_research_area", mauve=False, classifier=False)
    gamed = system_metrics(hacked, targets, **common)
    honest = system_metrics(test["abstract"].tolist(), targets, **common)
    assert gamed["ifacc_reward"] == 1.0
    assert gamed["ifacc_judge"] < honest["ifacc_judge"]  # the judge prefers the real texts the reward ranks lower
    assert honest["ifacc_reward"] < 1.0
    assert 0.0 <= honest["djs_text"]["1way_mean"] <= math.sqrt(math.log(2))


def test_same_reader_djs_reads_each_real_text_with_a_judge_not_fitted_on_it(biorxiv, schema, monkeypatch):
    """The real side of ``djs_text_same_reader`` is read out of fold (every text once, never by a judge
    that saw it), and with the judge's bias on both sides real texts sit closer than against the oracle."""
    from dpsynth_core.actg.evaluation import cross_fitted_reading, system_metrics
    from dpsynth_core.actg.supervised import SupervisedExtractor, columns_attributes

    train, test = biorxiv.iloc[:110], biorxiv.iloc[110:]
    texts, rows = train["abstract"].tolist(), columns_attributes(train, schema)
    fit, reads = SupervisedExtractor.fit.__func__, []

    def recording_fit(cls, fit_texts, fit_rows, schema_, **kwargs):
        judge, seen = fit(cls, fit_texts, fit_rows, schema_, **kwargs), set(fit_texts)
        extract = judge.extract
        judge.extract = lambda read: reads.append((seen, list(read))) or extract(read)
        return judge

    monkeypatch.setattr(SupervisedExtractor, "fit", classmethod(recording_fit))
    real_read = cross_fitted_reading(texts, rows, schema, folds=5)
    monkeypatch.undo()
    assert len(reads) == 5 and all(not seen & set(read) for seen, read in reads)
    assert sorted(t for _, read in reads for t in read) == sorted(texts)
    assert len(real_read) == len(texts) and all(set(r) == set(schema.field_names) for r in real_read)

    judge = SupervisedExtractor.fit(texts, rows, schema, features="tfidf")
    honest = system_metrics(test["abstract"].tolist(), columns_attributes(test, schema), real_texts=texts,
                            real_rows=rows, judge=judge, reward=KeywordReward(schema), emb=None,
                            cats=schema.categories(), fields=schema.field_names, label_field="primary_research_area",
                            mauve=False, classifier=False, real_read=real_read)
    assert honest["djs_text_same_reader"]["1way_mean"] < honest["djs_text"]["1way_mean"]


def test_pools_are_disjoint_and_cover_the_rows():
    from dpsynth_core.actg.pools import pool_labels, pool_sizes

    for n in (3, 6, 7, 50, 301):
        labels = pool_labels(n, 1 / 3, 1 / 3)
        assert len(labels) == n and set(labels) == {"anchor", "rl", "eval"}
        idx = {p: {i for i, x in enumerate(labels) if x == p} for p in ("anchor", "rl", "eval")}
        assert not idx["anchor"] & idx["rl"] and not idx["rl"] & idx["eval"] and not idx["anchor"] & idx["eval"]
    assert pool_sizes(50, 0.2, 0.3) == {"anchor": 10, "rl": 15, "eval": 25}
    with pytest.raises(ValueError):
        pool_sizes(2, 1 / 3, 1 / 3)
    with pytest.raises(ValueError, match="evaluation"):
        ActgConfig(features={"anchor_share": 0.5, "rl_share": 0.5})


def test_djs_uses_scipys_default_base_e():
    """The reference's figures use scipy's jensenshannon default (natural log): disjoint supports
    are at sqrt(ln 2) = 0.833, not 1 (base 2)."""
    from dpsynth_core.actg.features import marginal_djs

    a = pd.DataFrame({"x": ["u"] * 5})
    b = pd.DataFrame({"x": ["v"] * 5})
    assert marginal_djs(a, b, 1)["mean"] == pytest.approx(math.sqrt(math.log(2)))


def test_auto_extractor_is_supervised_with_a_public_file_and_zero_shot_with_a_note_without(tmp_path):
    with_file = ActgConfig(data={"public_path": str(tmp_path / "public.csv")})
    assert with_file.extractor.kind == "supervised" and with_file.extractor_note() is None
    assert with_file.reward_config(tmp_path).kind == "supervised"  # reward: the extractor, fitted on that file
    without = ActgConfig()
    assert without.extractor.kind == "embedding" and "data.public_path" in without.extractor_note()
    assert ActgConfig(extractor={"kind": "embedding"}).extractor_note() is None  # a named kind: no note
    assert ActgConfig(mode="vanilla").extractor_note() is None  # no attributes in the ablation


def test_drawn_options_follow_the_classifiers_probabilities_record_by_record():
    """AIM reads the drawn table: each record's option drawn from its own P(option | text) (so the table's margins
    are the probabilities' means, not pulled towards the frequent option), the most likely ones for the generator;
    ``proba`` is sklearn's predict_proba for the binary and the multi-class case."""
    from sklearn.linear_model import LogisticRegression

    from dpsynth_core.actg.supervised import _LinearField

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 3))
    for n_classes in (2, 3):
        y = [str(v) for v in (x[:, 0] + 0.8 * rng.normal(size=400) > 0).astype(int) + (x[:, 1] > 1) * (n_classes - 2)]
        clf = LogisticRegression().fit(x, y)
        field = _LinearField([str(c) for c in clf.classes_], clf.coef_, clf.intercept_)
        np.testing.assert_allclose(field.proba(x), clf.predict_proba(x), atol=1e-9)
        assert field.predict(x) == list(clf.predict(x))
        rows = np.repeat(x[:5], 4000, axis=0)  # 5 records, many draws each
        drawn = np.array(field.draw(rows, np.random.default_rng(1))).reshape(5, 4000)
        for i in range(5):
            freq = [np.mean(drawn[i] == c) for c in field.classes]
            np.testing.assert_allclose(freq, field.proba(x[i:i + 1])[0], atol=0.03)
