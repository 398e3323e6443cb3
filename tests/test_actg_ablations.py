"""ACTG's references and ablations: epsilon = inf (no noise, marked not private), "AIM -> DP-FT
feature generator", "direct prompting", and the public labeled data shown in the ledger."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dpsynth_core.actg.pipeline import ActgConfig, RunDir, open_or_create_ledger, prepare_run_dir
from dpsynth_core.actg.schema import builtin_schema
from dpsynth_core.privacy import PrivacyLedger

FIELDS = ["primary_research_area", "model_organism"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[Path, Path]:
    """A bioRxiv slice (texts + the oracle's columns) and a two-field schema: small and fast."""
    from dpsynth_core.data import load_biorxiv

    root = tmp_path_factory.mktemp("actg_data")
    frame = load_biorxiv().head(130)[["abstract", "category", *FIELDS]]
    frame = frame.assign(abstract=frame["abstract"].str.slice(0, 300))
    frame.head(110).to_csv(root / "records.csv", index=False)
    frame.tail(20).to_csv(root / "public.csv", index=False)  # a separate file, declared public
    full = builtin_schema("biorxiv").to_dict()
    full["fields"] = [f for f in full["fields"] if f["name"] in FIELDS]
    (root / "schema.yaml").write_text(yaml.safe_dump(full))
    return root / "records.csv", root / "schema.yaml"


def _config(data, run_dir: Path, **update) -> ActgConfig:
    records, schema = data
    raw = {"name": "abl", "output_dir": str(run_dir), "schema_path": str(schema),
           "data": {"path": str(records), "n_records": 40, "n_eval": 20, "public_path": str(records.parent / "public.csv"),
                    "sample_fraction": 0.45, "max_chars": 300},  # 40 of the 90 rows not held out
           "extractor": {"kind": "columns"}, "reward": {"kind": "supervised"},
           "features": {"n_synthetic": 6, "options": {"rounds": 2}},  # AIM: 2 rounds suffice here
           "generator": {"model": "tiny-llama", "steps": 2, "expected_batch_size": 8, "physical_batch_size": 8,
                         "max_seq_len": 64, "learning_rate": 0.001, "accountant": "rdp"},
           "generation": {"max_new_tokens": 8, "batch_size": 8, "engine": "hf"},
           "evaluation": {"mauve": False, "classifier": False, "label_field": "primary_research_area"}}
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return ActgConfig.model_validate(raw)


def _stage(cfg: ActgConfig, *names: str) -> Path:
    from dpsynth_core.actg.pipeline import STAGE_FUNCTIONS

    root = prepare_run_dir(cfg, resume=True)
    open_or_create_ledger(cfg, root)
    for name in names:
        RunDir(root).mark(name, STAGE_FUNCTIONS[name](cfg, str(root)))
    return root


def _charged(root: Path) -> list[tuple[str, str]]:
    return [(e.stage, e.kind) for e in PrivacyLedger.open(root).entries() if e.kind != "post_processing"]


def test_epsilon_inf_is_refused_unless_not_private(data, tmp_path):
    with pytest.raises(ValueError, match="not_private: true"):
        _config(data, tmp_path / "a", privacy={"epsilon": math.inf})
    with pytest.raises(ValueError, match="only for reference runs"):
        _config(data, tmp_path / "b", not_private=True)
    cfg = _config(data, tmp_path / "c", privacy={"epsilon": math.inf}, not_private=True)
    assert cfg.epsilon_features == math.inf and cfg.epsilon_generator == math.inf  # inf - inf would be nan


def test_epsilon_inf_actg_adds_no_noise_and_is_marked_not_private(data, tmp_path):
    """AIM and DP-SGD are replaced by their noiseless limits: features are real rows, the generator
    trains with sigma = 0 and no clipping; no event is recorded and every output says NOT PRIVATE."""
    cfg = _config(data, tmp_path / "run", privacy={"epsilon": math.inf}, not_private=True)
    root = _stage(cfg, "schema", "private")
    ledger = PrivacyLedger.open(root)
    assert _charged(root) == []  # nothing finite to record
    marks = {m["stage"] for m in ledger.not_private_reasons()}
    assert {"actg.reference", "features", "dp_generator"} <= marks and not ledger.to_dict()["private"]
    gen = RunDir(root).summary("dp_generator")
    assert gen["noise_multiplier"] == 0.0 and gen["clipping_norm"] is None and gen["steps"] == 2
    trained = json.loads((root / "generator" / "adapter" / "dp_training.json").read_text())
    assert trained["noise_multiplier"] == 0.0 and trained["clipping"] == "none"
    real = pd.read_csv(data[0], dtype=str)[FIELDS]
    real_rows = set(map(tuple, real.itertuples(index=False)))
    synth = pd.read_csv(root / "features.csv", dtype=str, keep_default_na=False)
    assert len(synth) == 6 and set(map(tuple, synth[FIELDS].itertuples(index=False))) <= real_rows


def test_noiseless_training_really_has_no_noise_or_clipping(data):
    """One step of the reference trainer's update equals the plain mean gradient of the batch: with
    the DP engine's noise (or clipping) it would not."""
    import torch

    from dpsynth_core.dpsgd.noiseless import no_clipping
    from dpsynth_core.dpsgd import DpSgdConfig, TrainExample
    from dpsynth_core.dpsgd.engine import DpSgdEngine

    examples = [TrainExample(prompt="Topic: x\n", target=f" text number {i} about kinases") for i in range(6)]
    config = DpSgdConfig(model="tiny-llama", epsilon=math.inf, steps=1, expected_batch_size=6, physical_batch_size=6,
                         max_seq_len=32, max_grad_norm=1e-6, learning_rate=0.01, device="cpu")
    engine = DpSgdEngine(examples, config, noise_multiplier=0.0, sampling_seed=0, clipper_factory=no_clipping)
    groups = [[i] for i in range(6)]
    buffers, _, _ = engine.clipped_sum(groups)
    for p in engine.params:
        p.grad = None
    from dpsynth_core.dpsgd.data import collate, per_example_loss

    batch = collate([engine.tokenized[i] for i in range(6)], engine.pad_id)
    out = engine.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"])
    per_example_loss(out.logits, batch["labels"]).sum().backward()
    norm = torch.cat([b.reshape(-1) for b in buffers]).norm()
    assert norm > 1e-3  # far above the 1e-6 clipping norm: nothing was clipped
    for buf, p in zip(buffers, engine.params):
        assert torch.allclose(buf, p.grad, atol=1e-6)


def test_direct_prompting_spends_no_eps2_and_public_data_is_in_the_ledger(data, tmp_path):
    """generator_mode: direct_prompt: the base model is prompted (no training); the ledger charges
    only the features (eps1) and says eps2 was not spent; the public labeled rows that trained the
    reward are a zero-epsilon entry; the release carries no adapter."""
    from dpsynth_core.actg.pipeline import run_pipeline
    from dpsynth_core.privacy.release_check import verify_release

    cfg = _config(data, tmp_path / "run", generator_mode="direct_prompt", privacy={"epsilon": 4.0})
    assert cfg.stages == ["schema", "reward_model", "private", "synthesize", "evaluate"]
    root = run_pipeline(cfg, resume=True)
    ledger = PrivacyLedger.open(root)
    assert _charged(root) == [("features", "zcdp")]
    entries = {e.stage: e for e in ledger.entries()}
    assert entries["dp_generator"].kind == "post_processing" and entries["dp_generator"].details["epsilon"] == 0.0
    public = entries["public_labeled_data"]
    assert public.kind == "post_processing" and public.epsilon == 0.0 and public.details["rows"] == 20
    assert ledger.total_epsilon() <= cfg.epsilon_features + 1e-9
    m = json.loads((root / "metrics.json").read_text())
    assert set(m["systems"]) == {"direct_prompt"} and m["systems"]["direct_prompt"]["n_texts"] == 2  # eval pool
    assert m["not_private"] is False
    released = set(verify_release(root)["files"])
    assert "synthetic.jsonl" in released and not any("adapter" in f for f in released)
    assert "public_labeled_data" in (root / "release" / "ledger.json").read_text()
    assert not (root / "generator").exists()


def test_dp_ft_feature_generator_is_charged_under_eps1(data, tmp_path):
    """features.generator: dp_ft: an LM DP-fine-tuned on the attribute rows (its own DpSgdEvent
    under eps1, stage 'features'), sampled option by option into schema-valid rows."""
    cfg = _config(data, tmp_path / "run", generator_mode="direct_prompt",
                  features={"generator": "dp_ft", "lm": {"steps": 2, "max_seq_len": 64}})
    root = _stage(cfg, "schema", "private")
    ledger = PrivacyLedger.open(root)
    assert _charged(root) == [("features", "dpsgd")]
    (event,) = [e for e in ledger.entries() if e.stage == "features"]
    assert event.epsilon <= cfg.epsilon_features + 1e-9 and event.params["noise_multiplier"] > 0
    summary = RunDir(root).summary("features")
    assert summary["generator"] == "dp_ft" and summary["noise_multiplier"] == event.params["noise_multiplier"]
    synth = pd.read_csv(root / "features.csv", dtype=str, keep_default_na=False)
    schema = builtin_schema("biorxiv")
    assert len(synth) == 6 and all(synth[f].isin(schema.options(f)).all() for f in FIELDS)


def test_option_scores_match_unpadded_log_likelihoods():
    """The batched, right-padded option scoring equals each option's log-likelihood computed alone."""
    import torch

    from dpsynth_core.actg.feature_lm import option_logprobs
    from dpsynth_core.models import load_causal_lm

    model, tok = load_causal_lm("tiny-llama")
    model.eval()
    prefix, options = "Attributes:\n- Area:", ["Ecology", "Cell Biology", "Pharmacology and Toxicology"]
    batched = option_logprobs(model, tok, prefix, options)
    for option, got in zip(options, batched):
        p = tok(prefix, add_special_tokens=True)["input_ids"]
        full = p + tok(" " + option + "\n", add_special_tokens=False)["input_ids"]
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=torch.tensor([full])).logits.float(), dim=-1)[0]
        alone = sum(float(logp[t - 1, full[t]]) for t in range(len(p), len(full)))
        assert got == pytest.approx(alone, abs=1e-4)
