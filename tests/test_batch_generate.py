"""Ray Data batch generation: 200 rows on tiny-llama, sharded, resumable."""

import pandas as pd
import pytest

from dpsynth_core.errors import ConfigError
from ray_jobs.batch_generate import BatchGenerateConfig, run


def _config(tmp_path, **overrides):
    base = dict(
        model="tiny-llama", prompt="attributes: area=Neuroscience", num_rows=200, max_new_tokens=4,
        num_actors=1, cpus_per_actor=1, batch_size=25, shard_size=100, output_dir=tmp_path / "out",
    )
    base.update(overrides)
    return BatchGenerateConfig(**base)


def test_batch_generation_200_rows_and_resume(ray_session, tmp_path):
    config = _config(tmp_path)
    summary = run(config)
    assert summary["rows_generated"] == 200 and summary["shards_total"] == 2
    shards = sorted(config.output_dir.glob("shard-*.parquet"))
    assert len(shards) == 2
    frame = pd.concat(pd.read_parquet(p) for p in shards)
    assert sorted(frame["id"].tolist()) == list(range(200))
    assert frame["text"].map(lambda t: isinstance(t, str)).all()

    # Resume: drop one shard; only it is regenerated, the other is left untouched.
    kept_mtime = shards[0].stat().st_mtime_ns
    shards[1].unlink()
    again = run(config)
    assert again["shards_skipped"] == 1 and again["rows_generated"] == 100
    assert shards[0].stat().st_mtime_ns == kept_mtime
    assert shards[1].exists()


def test_config_needs_exactly_one_prompt_source(tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        BatchGenerateConfig(output_dir=tmp_path)
    from dpsynth_core.config import load_config

    bad = tmp_path / "bad.yaml"
    bad.write_text("prompt: hi\nnum_rows: 0\n")
    with pytest.raises(ConfigError, match="num_rows"):
        load_config(bad, BatchGenerateConfig)
