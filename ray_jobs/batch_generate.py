"""Batch generation at scale with Ray Data: `map_batches` over generator actors.

    python -m ray_jobs.batch_generate --config configs/batch_generate_demo.yaml

Large N (say 100,000 texts or rows) from a base model plus an optional DP-trained LoRA adapter.
Generation is post-processing of a DP model (zero privacy cost); the prompts are synthetic
(DP attribute rows, a fixed table prompt), never private records.

Output: ``<output_dir>/shard-00000.parquet`` ... (or .jsonl), one per ``shard_size`` rows.
Resumable: a shard is written atomically (temp name, then rename) and skipped on re-run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import Field, model_validator

from dpsynth_core.config import StrictConfig, load_config
from dpsynth_core.errors import ConfigError
from dpsynth_core.storage import RunDirPath, require_durable_run_dir
from ray_jobs.cluster import ensure_ray


class BatchGenerateConfig(StrictConfig):
    model: str = "smollm2-135m-instruct"
    adapter_dir: Path | None = None
    # Prompts: either a file with a prompt column, or one prompt repeated num_rows times.
    prompts_file: Path | None = None
    prompt_column: str = "prompt"
    prompt: str | None = None
    num_rows: int = Field(100, gt=0)
    chat: bool = False
    max_new_tokens: int = Field(64, gt=0, le=4096)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    seed: int = 0
    # "module:function" returning a transformers LogitsProcessorList (e.g. constrained decoding).
    logits_processor: str | None = None
    num_actors: int = Field(1, gt=0)
    batch_size: int = Field(16, gt=0)
    cpus_per_actor: float = Field(1.0, gt=0)
    gpus_per_actor: float = Field(0.0, ge=0)
    shard_size: int = Field(1000, gt=0)
    output_dir: RunDirPath = Path("runs/batch_generate")  # a path or file:// URI (shared storage on a cluster)
    output_format: Literal["parquet", "jsonl"] = "parquet"

    @model_validator(mode="after")
    def _one_prompt_source(self):
        if (self.prompts_file is None) == (self.prompt is None):
            raise ValueError("give exactly one of 'prompts_file' or 'prompt'")
        return self


def load_prompts(config: BatchGenerateConfig) -> list[str]:
    if config.prompt is not None:
        return [config.prompt] * config.num_rows
    from dpsynth_core.data import load_records

    frame = load_records(config.prompts_file, text_col=config.prompt_column)
    return frame[config.prompt_column].astype(str).tolist()


class GeneratorActor:
    """Holds one model replica; called by Ray Data on batches of prompts."""

    def __init__(self, config: dict) -> None:
        import torch

        torch.set_num_threads(max(1, int(config["cpus_per_actor"])))
        self.config = BatchGenerateConfig.model_validate(config)
        if self.config.adapter_dir is not None:
            from dpsynth_core.dpsgd import load_generator

            self.model, self.tokenizer = load_generator(self.config.model, self.config.adapter_dir)
        else:
            from dpsynth_core.models import load_causal_lm

            self.model, self.tokenizer = load_causal_lm(self.config.model)
        self.processor = None
        if self.config.logits_processor:
            import importlib

            module, _, name = self.config.logits_processor.partition(":")
            self.processor = getattr(importlib.import_module(module), name)(self.tokenizer)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        from dpsynth_core.generation import SamplingParams, sample_texts

        ids = batch["id"]
        params = SamplingParams(
            max_new_tokens=self.config.max_new_tokens, temperature=self.config.temperature,
            top_p=self.config.top_p, seed=self.config.seed + int(ids[0]), chat=self.config.chat,
        )
        texts = sample_texts(self.model, self.tokenizer, list(batch["prompt"]), params, self.processor)
        return {"id": ids, "prompt": batch["prompt"], "text": np.asarray(texts, dtype=object)}


def _shard_path(config: BatchGenerateConfig, index: int) -> Path:
    return config.output_dir / f"shard-{index:05d}.{config.output_format}"


def _write_atomic(frame: pd.DataFrame, path: Path, fmt: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    if fmt == "parquet":
        frame.to_parquet(tmp, index=False)
    else:
        frame.to_json(tmp, orient="records", lines=True, force_ascii=False)
    os.replace(tmp, path)


def run(config: BatchGenerateConfig) -> dict:
    """Generate every missing shard; return throughput figures."""
    import ray
    from tqdm import tqdm

    prompts = load_prompts(config)
    config.output_dir.mkdir(parents=True, exist_ok=True)
    n_shards = (len(prompts) + config.shard_size - 1) // config.shard_size
    todo = [i for i in range(n_shards) if not _shard_path(config, i).exists()]
    ensure_ray()  # join the cluster (RAY_ADDRESS / submitted job) or embed a local Ray
    ray.data.DataContext.get_current().enable_progress_bars = False  # our bar counts shards
    start = time.perf_counter()
    rows = 0
    for index in tqdm(todo, desc="shards", unit="shard", initial=n_shards - len(todo), total=n_shards):
        lo, hi = index * config.shard_size, min(len(prompts), (index + 1) * config.shard_size)
        items = [{"id": i, "prompt": prompts[i]} for i in range(lo, hi)]
        ds = ray.data.from_items(items, override_num_blocks=max(1, config.num_actors * 2))
        out = ds.map_batches(
            GeneratorActor,
            fn_constructor_kwargs={"config": config.model_dump(mode="json")},
            batch_size=config.batch_size,
            concurrency=config.num_actors,
            num_cpus=config.cpus_per_actor,
            num_gpus=config.gpus_per_actor or None,
            batch_format="numpy",
        )
        frame = out.to_pandas().sort_values("id").reset_index(drop=True)
        _write_atomic(frame, _shard_path(config, index), config.output_format)
        rows += len(frame)
    elapsed = time.perf_counter() - start
    summary = {
        "rows_generated": rows, "shards_total": n_shards, "shards_skipped": n_shards - len(todo),
        "seconds": round(elapsed, 2), "rows_per_s": round(rows / elapsed, 3) if rows else 0.0,
        "num_actors": config.num_actors,
    }
    (config.output_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def main(config_path: Path, resume: bool = True) -> Path:
    config = load_config(config_path, BatchGenerateConfig)
    require_durable_run_dir(config.output_dir, "output_dir")  # a submitted job must write to shared storage
    if not resume and config.output_dir.exists() and any(config.output_dir.glob("shard-*")):
        raise ConfigError(f"{config.output_dir}: already holds shards; remove it or run with resume")
    summary = run(config)
    print(json.dumps(summary))
    return config.output_dir


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--config":
        sys.exit("usage: python -m ray_jobs.batch_generate --config FILE")
    main(Path(sys.argv[2]))
