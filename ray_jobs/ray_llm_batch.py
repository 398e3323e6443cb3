"""Batch generation on Ray's own LLM layer: a ``ray.data.llm`` vLLM processor (``runner: ray_data_llm``).

The processor owns the engine actors (one vLLM engine each, ``num_actors`` of them) and batches rows
into them; the default runner (``actors``) maps our own engine over the dataset instead. Same rows
out: ``id``, ``prompt``, ``text``. Generation is post-processing of a (DP) model: the per-row seed is
the config seed plus the row id. Prompts are synthetic (never private records), as for every runner.
"""

from __future__ import annotations

from pathlib import Path


def model_source(config) -> str:
    """The directory vLLM loads: the base model's, or base + adapter merged (cached)."""
    from dpsynth_core.models import resolve_model_dir

    if config.adapter_dir is None:
        return str(resolve_model_dir(config.model))
    from dpsynth_core.engines.adapters import adapter_kind, merge_adapter
    from dpsynth_core.engines.vllm_engine import merged_dir

    adapter = Path(config.adapter_dir)
    if adapter_kind(adapter) == "merged":
        return str(adapter)
    return str(merge_adapter(config.model, adapter, merged_dir(config.model, adapter)))


def render_prompts(config, prompts: list[str]) -> list[str]:
    """Chat-templated here, once, with the model's own tokenizer (the engine gets plain text)."""
    if not config.chat:
        return prompts
    from dpsynth_core.models import load_tokenizer

    tokenizer = load_tokenizer(config.model)
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts]


def processor_config(config):
    """``vLLMEngineProcessorConfig`` with the settings of our own vLLM engine (serving.vllm_backend)."""
    from ray.data.llm import vLLMEngineProcessorConfig

    from serving.ray_llm import engine_log_level, job_env_vars
    from serving.vllm_backend import engine_settings

    on_gpu = config.gpus_per_actor > 0
    engine, env = engine_settings(dtype=config.dtype, kv_cache_gib=4.0, on_gpu=on_gpu)
    # Ray Data sets enable_log_requests=False itself (prompts never reach the logs)
    engine.update(max_model_len=2048 + config.max_new_tokens, max_num_seqs=max(1, config.batch_size))
    bundle = {"CPU": config.cpus_per_actor, **({"GPU": config.gpus_per_actor} if on_gpu else {})}
    return vLLMEngineProcessorConfig(
        model_source=model_source(config), engine_kwargs=engine, batch_size=config.batch_size,
        concurrency=config.num_actors, placement_group_config={"bundles": [bundle]},
        # the engine actor's env_vars replace the job's whole: they start from the job's (the quiet environment),
        # vLLM logs at the caller's level, and our worker setup (not Ray LLM's) quiets Ray LLM's own loggers
        runtime_env={"env_vars": {**job_env_vars(), **env, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                                  "VLLM_LOGGING_LEVEL": engine_log_level()},
                     "worker_process_setup_hook": "dpsynth_core.quiet.ray_worker_setup"},
        chat_template_stage=False, tokenize_stage=False, detokenize_stage=False, log_engine_metrics=False,
    )


def generate(items: list[dict], config, num_blocks: int):
    """Rows ``{id, prompt}`` -> a dataset of ``{id, prompt, text}`` (chat template applied first when ``chat``)."""
    import ray
    from ray.data.llm import build_processor

    requests = render_prompts(config, [item["prompt"] for item in items])
    rows = [{**item, "request": request} for item, request in zip(items, requests)]
    sampling = {"max_tokens": config.max_new_tokens, "temperature": config.temperature, "top_p": config.top_p}
    seed = config.seed

    def preprocess(row: dict) -> dict:
        # the engine stage consumes "prompt"; the original prompt rides along as "source"
        return {"id": row["id"], "source": row["prompt"], "prompt": row["request"],
                "sampling_params": {**sampling, "seed": (seed + int(row["id"])) % 2**31}}

    def postprocess(row: dict) -> dict:
        return {"id": row["id"], "prompt": row["source"], "text": row["generated_text"].strip()}

    processor = build_processor(processor_config(config), preprocess=preprocess, postprocess=postprocess)
    keep_ray_quiet()  # build_processor calls ray.init() again, which sets Ray's logger back to INFO
    return processor(ray.data.from_items(rows, override_num_blocks=num_blocks))


def keep_ray_quiet() -> None:
    """Ray's and Ray Data's driver-side loggers at the quiet run's levels (Ray Data logs each dataset's
    plan, start and end at INFO, and warns that we turned its progress bars off: ours counts shards)."""
    import logging

    from dpsynth_core.quiet import verbose

    if not verbose():
        logging.getLogger("ray").setLevel(logging.WARNING)
        logging.getLogger("ray.data").setLevel(logging.ERROR)
