"""Which attribute extractor should ACTG use on a corpus without attribute labels? (issue 41, item 3)

    .venv/bin/python experiments/extractor_choice.py --split choose  --out runs/extractor_choice
    .venv/bin/python experiments/extractor_choice.py --split report  --out runs/extractor_choice

bioRxiv's 1,500 abstracts are cut into two disjoint halves by a keyed hash of each DOI: the setting is chosen
on ``choose`` and reported, unchanged, on ``report``. In each half: 250 rows play the declared-public labeled
file, 300 rows the private corpus (its oracle labels hidden from every extractor), and 200 rows the unseen
abstracts the synthetic attribute table is compared with. Per extractor, on the 300 private texts:

* agreement with the oracle labels (share of (record, field) pairs equal, mean over the 8 fields), and
* the AIM table it leads to: AIM at eps1 = 2 (delta 1e-5, as the demo's features stage) on the extracted
  attributes, 300 rows, and the mean 1-way d_JS (base e) of that table from the TRUE attributes of the 200 unseen
  abstracts; ``--repeats`` fits (AIM's noise is drawn from OS entropy), mean +- sd.

Reference rows: the oracle columns fed to AIM (``columns``: the best any extractor can do) and the 300 private
rows' true attributes themselves, no DP (``real sample``: the floor set by sampling alone). Only aggregates are
written (results.json); no abstract is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "biorxiv" / "biorxiv_1500.csv"
SPLIT_KEY = b"extractor-choice-2026-11-26"  # fixed before any figure was looked at
MAX_CHARS = 600  # the demo's data.max_chars


def _halves():
    import pandas as pd

    df = pd.read_csv(DATA)
    key = df["doi"].map(lambda d: hashlib.sha256(SPLIT_KEY + str(d).encode()).hexdigest())
    df = df.assign(_key=key).sort_values("_key").reset_index(drop=True)
    first = df["_key"].map(lambda k: int(k[0], 16) < 8)
    return {"choose": df[first].reset_index(drop=True), "report": df[~first].reset_index(drop=True)}


def _texts(frame) -> list[str]:
    return [str(a)[:MAX_CHARS] for a in frame["abstract"]]


def _rows(frame, schema) -> list[dict]:
    from dpsynth_core.actg.extractor_base import snap_to_option

    rows = frame["schema"].map(json.loads).tolist()
    return [{f.name: snap_to_option(str(r.get(f.name, "")), f) for f in schema.fields} for r in rows]


def _aim_djs(attrs: list[dict], unseen: list[dict], schema, repeats: int) -> dict:
    import pandas as pd

    from dpsynth_core.actg import features
    from dpsynth_core.privacy import PrivacyLedger

    cats = schema.categories()
    truth = pd.DataFrame(unseen, columns=schema.field_names)
    real = pd.DataFrame(attrs, columns=schema.field_names)
    values, two_way, seconds = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            ledger = PrivacyLedger.create(Path(tmp), "extractor_choice", 2.0, 1e-5, public_size=300)
            t0 = time.time()
            synth = features.synthesize_features(real, schema, epsilon=2.0, n_rows=300, ledger=ledger)
            seconds.append(time.time() - t0)
        values.append(features.marginal_djs(truth, synth, order=1, categories=cats)["mean"])
        two_way.append(features.marginal_djs(truth, synth, order=2, categories=cats)["mean"])
    sd = (lambda v: statistics.stdev(v) if repeats > 1 else None)  # noqa: E731
    return {"djs_1way_mean": statistics.mean(values), "djs_1way_sd": sd(values), "runs": values,
            "djs_2way_mean": statistics.mean(two_way), "djs_2way_sd": sd(two_way),
            "aim_seconds_mean": statistics.mean(seconds)}


def _agreement(attrs: list[dict], truth: list[dict], fields) -> float:
    from dpsynth_core.actg.text_eval import per_field_accuracy

    return per_field_accuracy(attrs, truth, fields)["mean"]


def model_embed(texts: list[str]):
    import numpy as np

    from dpsynth_core.models import load_embedder

    return np.asarray(load_embedder("minilm").encode(list(texts)), dtype=np.float64)


def _fit_decode(x_pub, pub_rows, x_priv, schema, c: float, decode: str) -> list[dict]:
    """One logistic regression per field; each private record's option by argmax, or drawn from the classifier's
    probabilities (OS entropy, independently per record: the table's margins follow the probabilities)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng()
    out = [dict() for _ in range(x_priv.shape[0])]
    for f in schema.fields:
        y = [r[f.name] for r in pub_rows]
        if len(set(y)) == 1:
            for o in out:
                o[f.name] = y[0]
            continue
        clf = LogisticRegression(C=c, max_iter=2000).fit(x_pub, y)
        proba = clf.predict_proba(x_priv)
        for i, p in enumerate(proba):
            j = int(p.argmax()) if decode == "argmax" else int(rng.choice(len(p), p=p))
            out[i][f.name] = str(clf.classes_[j])
    return out


def main() -> None:
    import pandas as pd

    from dpsynth_core.actg import features
    from dpsynth_core.actg.extractors import build_extractor
    from dpsynth_core.actg.schema import builtin_schema
    from dpsynth_core.actg.supervised import SupervisedExtractor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", choices=["choose", "report"], required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("runs/extractor_choice"))
    ap.add_argument("--variants", action="store_true",
                    help="also: the supervised extractor's regularisation C and decoding (argmax or a draw)")
    args = ap.parse_args()

    schema = builtin_schema("biorxiv")
    half = _halves()[args.split]
    public, private, unseen = half.iloc[:250], half.iloc[250:550], half.iloc[550:750]
    pub_texts, priv_texts = _texts(public), _texts(private)
    pub_rows, priv_truth, unseen_truth = _rows(public, schema), _rows(private, schema), _rows(unseen, schema)
    fields = schema.field_names
    results = {"split": args.split, "n_public": len(public), "n_private": len(private), "n_unseen": len(unseen),
               "epsilon_features": 2.0, "delta": 1e-5, "aim_rows": 300, "repeats": args.repeats, "rows": {}}

    def row(name: str, attrs: list[dict] | None, seconds: float | None, dp: bool = True) -> None:
        entry = {"extract_seconds": None if seconds is None else round(seconds, 1)}
        if attrs is not None:
            entry["agreement"] = _agreement(attrs, priv_truth, fields)
        if dp:
            entry.update(_aim_djs(attrs, unseen_truth, schema, args.repeats))
        else:  # the real sample itself, no DP: the floor
            cats = schema.categories()
            truth, sample = pd.DataFrame(unseen_truth, columns=fields), pd.DataFrame(priv_truth, columns=fields)
            for order in (1, 2):
                entry[f"djs_{order}way_mean"] = features.marginal_djs(truth, sample, order=order, categories=cats)["mean"]
        results["rows"][name] = entry
        print(name, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in entry.items() if k != "runs"},
              flush=True)

    row("real sample (no DP)", None, None, dp=False)
    row("columns (oracle labels)", priv_truth, 0.0)
    t0 = time.time()
    row("embedding zero-shot (MiniLM)", build_extractor({"kind": "embedding"}, schema).extract(priv_texts),
        time.time() - t0)
    for feats in ("embedding", "tfidf"):
        t0 = time.time()
        model = SupervisedExtractor.fit(pub_texts, pub_rows, schema, features=feats)
        row(f"supervised ({feats}, 250 public rows)", model.extract(priv_texts), time.time() - t0)
    # the product's choice (stage private with data.public_path): AIM on the drawn table, the generator on the
    # most likely options
    from dpsynth_core.actg.supervised import EXTRACTOR_C
    from dpsynth_core.privacy.randomness import secure_rng

    t0 = time.time()
    model = SupervisedExtractor.fit(pub_texts, pub_rows, schema, features="embedding", c=EXTRACTOR_C)
    likely, drawn = model.extract_and_draw(priv_texts, secure_rng())
    row(f"chosen: supervised (C = {EXTRACTOR_C}), AIM on drawn options", drawn, time.time() - t0)
    results["rows"][f"chosen: supervised (C = {EXTRACTOR_C}), AIM on drawn options"]["agreement_most_likely"] = \
        _agreement(likely, priv_truth, fields)
    if args.variants:
        x_pub, x_priv = model_embed(pub_texts), model_embed(priv_texts)
        for c in (0.1, 1.0, 10.0):
            for decode in ("argmax", "sample"):
                t0 = time.time()
                attrs = _fit_decode(x_pub, pub_rows, x_priv, schema, c, decode)
                row(f"supervised (embedding, C = {c}, {decode})", attrs, time.time() - t0)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"results_{args.split}.json").write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out / f'results_{args.split}.json'}")


if __name__ == "__main__":
    main()
