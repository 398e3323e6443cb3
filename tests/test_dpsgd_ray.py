"""DP-SGD on Ray Train: 2 workers equal 1 (noise added once); nothing private crosses Ray."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from dpsynth_core.dpsgd import DpSgdConfig, TrainExample, train_dp_lora
from dpsynth_core.dpsgd.sources import TableExampleSource
from dpsynth_core.errors import ConfigError

EXAMPLES = [TrainExample(f"Topic {i % 3}:\n", f"text number {i} " * (1 + i % 4)) for i in range(40)]
BASE = dict(model="tiny-llama", epsilon=2.0, delta=1e-3, expected_batch_size=4, physical_batch_size=4,
            clipping="hooks", learning_rate=1e-2, device="cpu")


def _table(tmp_path, texts) -> TableExampleSource:
    path = tmp_path / "private.csv"
    pd.DataFrame({"topic": [str(i % 3) for i in range(len(texts))], "text": texts}).to_csv(path, index=False)
    return TableExampleSource(path=str(path), text_column="text", prompt_columns=["topic"],
                              prompt_template="Topic {topic}:\n")


def test_two_workers_crash_resume_match_one_worker_and_leak_nothing(ray_session, tmp_path, monkeypatch):
    """2 Ray Train workers, killed after 2 of 3 steps and resumed, equal 1 in-process worker.

    Major 8: Train's state tracking is on, so train_loop_config is stringified into the run state
    Ray keeps; that state and every file of the Ray storage dir are scanned for the private records,
    the secret sampling seed and per-step batch sizes."""
    from ray.train.v2._internal.state.state_actor import get_state_actor
    from safetensors.torch import load_file

    from dpsynth_core.privacy import PrivacyLedger
    from ray_jobs.dp_finetune import RAY_STORAGE_DIRNAME, run_dp_finetune

    monkeypatch.setenv("RAY_TRAIN_ENABLE_STATE_TRACKING", "1")
    canaries = [f"zqx{i:03d}canary{i * 7919 % 1000:03d}" for i in range(40)]
    examples = [TrainExample(e.prompt, f"{e.target}{c}") for e, c in zip(EXAMPLES, canaries)]
    source = _table(tmp_path, [e.target for e in examples])
    assert [(e.prompt, e.target) for e in source.load()] == [(e.prompt, e.target) for e in examples]
    seed = 8815319097131  # fixed only to compare with the 1-worker run; must not show up in Ray's state
    cfg = dict(BASE, steps=3, sampling_seed=seed, checkpoint_every=1)
    ledger = PrivacyLedger.create(tmp_path / "run", "toy", 5.0, 1e-3)
    out = tmp_path / "w2"
    part = train_dp_lora(source, DpSgdConfig(**cfg, num_workers=2, stop_after_steps=2), output_dir=out,
                         ledger=ledger, progress=False, runner=run_dp_finetune)
    assert not part.completed and part.steps == 2 and ledger.entries() == []

    files = [f for f in (out / RAY_STORAGE_DIRNAME).rglob("*") if f.is_file()]
    assert any(f.name == "train_state.json" for f in files)  # the checkpoint: private state, for the resume
    assert (out / RAY_STORAGE_DIRNAME).stat().st_mode & 0o777 == 0o700  # the seed's folder: owner only
    runs = ray_session.get(get_state_actor().get_train_runs.remote())
    ray_state = json.dumps([r.model_dump(mode="json") for r in runs.values()], default=str)
    assert "train_loop_config" in ray_state and source.path in ray_state  # the public spec is there
    for where, text in [("Ray Train run state", ray_state)] + [(str(f), f.read_bytes().decode("latin-1")) for f in files]:
        assert not [c for c in canaries if c in text], f"private records in {where}"
        assert "batch_units" not in text, f"per-step Poisson batch sizes in {where}"
        if not where.endswith("train_state.json"):
            assert str(seed) not in text, f"secret sampling seed in {where}"

    two = train_dp_lora(source, DpSgdConfig(**cfg, num_workers=2), output_dir=out, ledger=ledger,
                        progress=False, runner=run_dp_finetune)
    one = train_dp_lora(examples, DpSgdConfig(**cfg), output_dir=tmp_path / "w1", progress=False)
    assert two.steps == one.steps == 3
    assert two.epsilon == pytest.approx(one.epsilon, rel=1e-12)
    assert ledger.total_epsilon() == pytest.approx(one.epsilon, rel=1e-9) and len(ledger.entries()) == 1
    assert not ledger.is_private  # the fixed sampling_seed and stop_after_steps are test-only knobs
    a = load_file(str(one.adapter_dir / "adapter_model.safetensors"))
    b = load_file(str(two.adapter_dir / "adapter_model.safetensors"))
    # noise twice (once per worker) or zero would move the weights far more than float reduction order
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert max(torch.count_nonzero(v).item() for k, v in b.items() if "lora_B" in k) > 0
    assert not (out / RAY_STORAGE_DIRNAME).exists()  # finished: no checkpoint (secret seed) left


def test_multi_worker_needs_a_runner_and_a_loadable_source(tmp_path):
    from ray_jobs.dp_finetune import run_dp_finetune

    cfg = DpSgdConfig(**BASE, steps=1, num_workers=2)
    with pytest.raises(ConfigError, match="runner"):
        train_dp_lora(EXAMPLES, cfg, output_dir=tmp_path / "a", progress=False)
    # records in memory would have to travel through Ray: refused before Ray or the ledger is touched
    with pytest.raises(ConfigError, match="ExampleSource"):
        train_dp_lora(EXAMPLES, cfg, output_dir=tmp_path / "b", progress=False, runner=run_dp_finetune)
    assert not (tmp_path / "b").exists()
