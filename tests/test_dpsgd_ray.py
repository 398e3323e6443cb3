"""2-worker Ray Train DP-SGD equals the 1-worker run: same epsilon, same weights (noise added once)."""

from __future__ import annotations

import pytest
import torch

from dpsynth_core.dpsgd import DpSgdConfig, TrainExample, train_dp_lora

EXAMPLES = [TrainExample(f"Topic {i % 3}:\n", f"text number {i} " * (1 + i % 4)) for i in range(40)]


def test_two_workers_match_one_worker(ray_session, tmp_path):
    from safetensors.torch import load_file

    from dpsynth_core.privacy import PrivacyLedger

    base = dict(model="tiny-llama", epsilon=2.0, delta=1e-3, steps=3, expected_batch_size=4, physical_batch_size=4,
                clipping="hooks", sampling_seed=11, learning_rate=1e-2, device="cpu")
    ledger = PrivacyLedger.create(tmp_path / "run", "toy", 5.0, 1e-3)
    two = train_dp_lora(EXAMPLES, DpSgdConfig(**base, num_workers=2), output_dir=tmp_path / "w2", ledger=ledger,
                        progress=False)
    one = train_dp_lora(EXAMPLES, DpSgdConfig(**base), output_dir=tmp_path / "w1", progress=False)
    assert two.steps == one.steps == 3
    assert two.epsilon == pytest.approx(one.epsilon, rel=1e-12)
    assert ledger.total_epsilon() == pytest.approx(one.epsilon, rel=1e-9) and len(ledger.entries()) == 1
    assert [h["batch_units"] for h in two.history] == [h["batch_units"] for h in one.history]
    a = load_file(str(one.adapter_dir / "adapter_model.safetensors"))
    b = load_file(str(two.adapter_dir / "adapter_model.safetensors"))
    # noise twice (once per worker) or zero would move the weights far more than float reduction order
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    assert max(torch.count_nonzero(v).item() for k, v in b.items() if "lora_B" in k) > 0
