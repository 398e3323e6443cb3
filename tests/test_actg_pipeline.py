"""ACTG-ARL pipeline: prompts, Best-of-N, config errors, end to end on Ray with tiny-llama, resume."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpsynth_core.actg.best_of_n import select_best
from dpsynth_core.actg.extractors import AttributeExtractor
from dpsynth_core.actg.generator import build_train_examples, format_prompt, load_prompt_template
from dpsynth_core.actg.pipeline import ActgConfig, load_actg_config
from dpsynth_core.actg.schema import builtin_schema, schema_from_dict
from dpsynth_core.data.sample_sizes import MAUVE_MIN_TEXTS
from dpsynth_core.errors import ConfigError, DataError
from tests.tiny_actg_run import ledger_stages

REPO = Path(__file__).resolve().parent.parent

MINI = schema_from_dict({"name": "mini", "fields": [
    {"name": "topic", "description": "Topic", "options": ["Neuroscience", "Ecology"]},
    {"name": "organism", "description": "Organism", "options": ["Human", "Plant"]},
]})


class KeywordExtractor(AttributeExtractor):
    """Picks the first option named in the text (else the first option): a tiny real extractor."""

    def extract(self, texts):
        return [{f.name: next((o for o in f.options if o.lower() in t.lower()), f.options[0])
                 for f in self.schema.fields} for t in texts]


def test_prompts_carry_every_attribute_and_vanilla_none():
    schema = builtin_schema("biorxiv")
    row = {f.name: f.options[-1] for f in schema.fields}
    p = format_prompt(schema, row, load_prompt_template("conditional"), text_description="bioRxiv abstract")
    assert all(v in p for v in row.values()) and "bioRxiv abstract" in p
    u = format_prompt(None, None, load_prompt_template("unconditional"), text_description="bioRxiv abstract")
    assert not any(v in u for v in row.values()) and "{" not in u
    ex = build_train_examples(["A text."], [row], schema, load_prompt_template("conditional"), text_description="x")
    assert ex[0].prompt.endswith("Text:\n") and ex[0].target == " A text."
    with pytest.raises(DataError, match="row 1: empty text") as err:
        build_train_examples(["secret words", "  "], None, None, load_prompt_template("unconditional"),
                             text_description="x")
    assert "secret" not in str(err.value)


def test_best_of_n_keeps_the_highest_ifacc_and_reports_plain_sampling():
    rows = [{"topic": "Ecology", "organism": "Plant"}, {"topic": "Neuroscience", "organism": "Plant"}]
    cands = [["about neuroscience in humans", "ecology of a plant", "ecology only"],
             ["neuroscience", "nothing here", "neuroscience of a plant"]]
    res = select_best(cands, rows, KeywordExtractor(MINI))
    assert res.best_index == [1, 2]
    assert res.best_scores == [1.0, 1.0]
    assert res.plain_ifacc == pytest.approx((0.0 + 0.5) / 2)  # first candidate of each row
    assert res.anchors()[0] == {"attributes": rows[0], "text": "ecology of a plant", "ifacc": 1.0}
    tie = select_best([["x", "y"]], [{"topic": "Neuroscience", "organism": "Human"}], KeywordExtractor(MINI))
    assert tie.best_index == [0]  # ties go to the earliest candidate


def test_config_errors_name_the_field(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("generator: {model: tiny-llama, steps: 2, epsilon: 3}\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*generator.*'epsilon' comes from the 'privacy'"):
        load_actg_config(bad)
    bad.write_text("rl: {gamma0: 2.0, gamma_zero: 1}\n")
    with pytest.raises(ConfigError, match=r"rl.gamma_zero"):
        load_actg_config(bad)
    vanilla = ActgConfig(mode="vanilla", privacy={"epsilon": 4.0})
    assert vanilla.stages == ["private", "synthesize", "evaluate"]
    assert vanilla.epsilon_generator == 4.0 and vanilla.epsilon_features == 0.0  # same total eps
    assert "{attributes}" not in vanilla.template_text()
    actg = load_actg_config(REPO / "configs" / "actg_demo.yaml")
    assert (actg.epsilon_features, actg.epsilon_generator) == (2.0, 2.0)


def test_pipeline_end_to_end_on_ray_with_resume(tiny_actg_run):
    # the run (tests/tiny_actg_run.py, shared with tests/test_report.py):
    # 1) "crash" once best_of_n has completed
    assert tiny_actg_run.interrupted
    run = tiny_actg_run.run
    stages = run / "stages"
    done_before = dict(tiny_actg_run.done_after_crash)
    assert set(done_before) == {f"{s}.done" for s in ["schema", "reward_model", "private", "features", "dp_generator",
                                                      "generate", "best_of_n"]}
    assert not tiny_actg_run.synthetic_after_crash
    charged = tiny_actg_run.charged_after_crash
    assert charged == [("features", "zcdp"), ("dp_generator", "dpsgd")]
    # 2) simulate a crash between the DP-SGD ledger record and its markers: the charged stage must
    #    be closed from its outputs, not trained (and charged) again
    assert tiny_actg_run.removed_markers == ("private", "dp_generator")
    for name in tiny_actg_run.removed_markers:
        done_before.pop(f"{name}.done")
    # 3) resume: completed stages are not re-run, nothing is charged twice
    run_dir = tiny_actg_run.resumed_run_dir
    assert Path(run_dir) == run
    for name, text in done_before.items():
        assert (stages / name).read_text() == text, f"{name} was re-run"
    assert json.loads((stages / "dp_generator.done").read_text())["closed_from_outputs"] is True
    entries = ledger_stages(run)
    assert [s for s in entries if s[1] != "post_processing"] == charged
    assert sorted(s for s, k in entries if k == "post_processing") == sorted(
        ["generate", "best_of_n", "anchored_rl", "synthesize"])
    # run directory contents
    for f in ["schema.yaml", "features.csv", "synthetic.jsonl", "ledger.sqlite", "metrics.json", "anchors.jsonl"]:
        assert (run / f).is_file(), f
    synthetic = [json.loads(line) for line in (run / "synthetic.jsonl").read_text().splitlines()]
    assert len(synthetic) == 6 and all(set(r) == {"text", "attributes", "pool"} for r in synthetic)
    # disjoint pools of features.csv rows: anchors (Best-of-N), RL prompts, evaluation (rows 0-1, 2-3, 4-5)
    import pandas as pd

    features = pd.read_csv(run / "features.csv", dtype=str, keep_default_na=False).to_dict("records")
    assert [r["pool"] for r in synthetic] == ["anchor"] * 2 + ["rl"] * 2 + ["eval"] * 2
    assert [json.loads(line)["attributes"] for line in (run / "anchors.jsonl").read_text().splitlines()] == features[:2]
    assert pd.read_csv(run / "rl_prompts.csv", dtype=str, keep_default_na=False).to_dict("records") == features[2:4]
    assert [json.loads(line)["attributes"] for line in (run / "plain_eval.jsonl").read_text().splitlines()] == \
        features[4:]
    m = json.loads((run / "metrics.json").read_text())
    assert m["ledger"]["total_epsilon"] <= 4.0 + 1e-9 and m["ledger"]["total_epsilon"] > 2.0
    for k in ("plain_sampling", "best_of_n", "after_rl"):
        assert 0.0 <= m["ifacc"][k] <= 1.0
    assert m["ifacc"]["best_of_n"] >= m["ifacc"]["best_of_n_plain"]
    for system in ("actg", "actg_arl"):  # IFAcc by the judge (not the reward) and by the reward, eval pool only
        s = m["systems"][system]
        assert s["n_texts"] == 2 and 0.0 <= s["ifacc_judge"] <= 1.0 and 0.0 <= s["ifacc_reward"] <= 1.0
        # 2 synthetic vs 16 real texts: below the measured minimum, "not enough texts" and no number (issue 38)
        assert s["mauve"] == {"mauve": None, "status": "not enough texts", "n_real": 16, "n_synthetic": 2,
                              "min_texts": MAUVE_MIN_TEXTS}
    assert m["mauve"]["mauve"] is None and m["mauve"]["status"] == "not enough texts"
    assert 0.0 <= m["features"]["djs_1way_mean"] <= 1.0
    assert {"lengths.png", "ifacc.png", "rl_curve.png", "features_djs.png"} <= {p.name for p in (run / "plots").iterdir()}
    from dpsynth_core.actg.report import summarize  # what `make demo` prints at the end

    headline = summarize(run)
    assert "actg_arl: 2 texts" in headline and f"epsilon {m['ledger']['total_epsilon']:.3f}" in headline
    # no private text in the run directory's summaries
    from dpsynth_core.data import load_biorxiv

    real = load_biorxiv()["abstract"].head(50).tolist()
    blob = (run / "metrics.json").read_text() + "".join(p.read_text() for p in stages.glob("*.done"))
    assert not any(r[:60] in blob for r in real)
    # release/: DP outputs, adapters and the ledger only (verified against its manifest)
    from dpsynth_core.privacy.release_check import verify_release

    released = set(verify_release(run)["files"])
    assert {"synthetic.jsonl", "features.csv", "schema.yaml", "ledger.json"} <= released
    assert any(f.startswith("generator_adapter/") for f in released) and any(f.startswith("rl_adapter/") for f in released)
    assert not any(f.startswith(("metrics", "plots", "candidates", "anchors")) for f in released)


def test_delta_must_be_below_one_over_the_private_set_size(tmp_path):
    """privacy.delta >= 1/n_records (n_records: the public expected size of the private set) is refused
    before any data are read, naming the field; the default is min(1e-5, n^-1.1) of that public size."""
    from dpsynth_core.actg.pipeline import open_or_create_ledger
    from dpsynth_core.privacy import default_delta

    with pytest.raises(ConfigError, match=r"field 'privacy.delta'.*not below 1/n"):
        open_or_create_ledger(ActgConfig(data={"n_records": 32}, privacy={"delta": 0.05}), tmp_path / "a")
    ledger = open_or_create_ledger(ActgConfig(data={"n_records": 32}), tmp_path / "b")
    assert ledger.delta == pytest.approx(default_delta(32)) == 1e-5  # min(1e-5, m^-1.1)
    assert ledger.public_size == 32  # stated with m * delta in `ledger show` and the release
