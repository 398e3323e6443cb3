"""gpu_strategy: fsdp2 through the Ray Train runner (issue 15.2): 2 gloo workers on CPU shard
tiny-llama, train with ghost_fsdp and record ONE ledger event with the epsilon of one worker."""

from __future__ import annotations

import pytest

from dpsynth_core.dpsgd import DpSgdConfig, TrainExample, train_dp_lora
from dpsynth_core.dpsgd.budget import plan_privacy

EXAMPLES = [TrainExample(f"Topic {i % 3}:\n", f"text number {i} " * (1 + i % 3)) for i in range(16)]


@pytest.mark.slow  # 2 Ray Train workers start and shard a model: minutes on the shared 2 cores
def test_fsdp2_two_workers_spend_the_epsilon_of_one(ray_session, tmp_path):
    import pandas as pd
    from peft import PeftConfig

    from dpsynth_core.dpsgd.sources import TableExampleSource
    from dpsynth_core.privacy import PrivacyLedger
    from ray_jobs.dp_finetune import run_dp_finetune

    path = tmp_path / "private.csv"
    pd.DataFrame({"topic": [e.prompt[6] for e in EXAMPLES], "text": [e.target for e in EXAMPLES]}).to_csv(path, index=False)
    source = TableExampleSource(path=str(path), text_column="text", prompt_columns=["topic"],
                                prompt_template="Topic {topic}:\n")
    cfg = DpSgdConfig(model="tiny-llama", epsilon=2.0, delta=1e-3, expected_batch_size=4, physical_batch_size=4,
                      steps=2, clipping="ghost", gpu_strategy="fsdp2", device="cpu", num_workers=2, max_seq_len=24)
    ledger = PrivacyLedger.create(tmp_path / "run", "toy", 5.0, 1e-3)
    res = train_dp_lora(source, cfg, output_dir=tmp_path / "out", ledger=ledger, progress=False,
                        runner=run_dp_finetune)
    one_worker = plan_privacy(cfg.model_copy(update={"num_workers": 1}), source.load())
    assert res.completed and res.steps == 2
    assert res.epsilon == pytest.approx(one_worker.epsilon_after(2), rel=1e-12)
    assert len(ledger.entries()) == 1 and ledger.total_epsilon() == pytest.approx(res.epsilon, rel=1e-9)
    assert (res.adapter_dir / "adapter_model.safetensors").is_file()
    assert PeftConfig.from_pretrained(str(res.adapter_dir)).r == cfg.lora.r
