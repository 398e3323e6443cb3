"""The two figures of ``dpsgd_gpu.py`` beyond DP-SGD (issue 15): generation with the DP adapter under
vLLM, and the ACTG tiny pipeline with every model stage forced onto one device.

Each returns a dict that says plainly when it was not measured and why (a missing package, no GPU,
a dry run); nothing here is imported before it is needed, so the DP-SGD part runs without them.
"""

from __future__ import annotations

import importlib.util
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ACTG_TINY = REPO / "configs" / "actg_tiny.yaml"
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


# --- generation with the DP adapter: vLLM ----------------------------------------------------------
def vllm_unavailable(device) -> str | None:
    """Why vLLM is not measured here, or None."""
    if device.type != "cuda":
        return "no GPU (vLLM is compared with HF on the GPU only)"
    if importlib.util.find_spec("vllm") is None:
        return "the vllm package is not installed on this machine"
    return None


def save_random_base(config, directory: Path) -> Path:
    """The benchmark's random base (seed 0, as ``dpsgd_gpu.build_model``) as an HF directory vLLM loads."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    base.save_pretrained(str(directory), safe_serialization=True)
    del base
    return directory


def vllm_generation_rate(base_dir: Path, adapter_dir: Path, prompt_ids: list[list[int]], new_tokens: int,
                         lora_rank: int) -> dict:
    """Tokens/s of vLLM sampling ``new_tokens`` per prompt through the DP adapter (a LoRA request).
    Token ids in, token ids out: the random model has no tokenizer."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    start = time.perf_counter()
    llm = LLM(model=str(base_dir), skip_tokenizer_init=True, dtype="bfloat16", enable_lora=True, max_loras=1,
              max_lora_rank=min(r for r in VLLM_LORA_RANKS if r >= lora_rank),
              max_model_len=max(len(p) for p in prompt_ids) + new_tokens + 8, gpu_memory_utilization=0.6)
    load_s = time.perf_counter() - start
    lora = LoRARequest("dp-adapter", 1, str(adapter_dir))
    params = SamplingParams(max_tokens=new_tokens, min_tokens=new_tokens, temperature=1.0, seed=3, detokenize=False)
    prompts = [{"prompt_token_ids": ids} for ids in prompt_ids]
    llm.generate(prompts[:1], params, lora_request=lora, use_tqdm=False)  # warm-up: CUDA graphs, LoRA load
    start = time.perf_counter()
    outputs = llm.generate(prompts, params, lora_request=lora, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"tokens_per_s": tokens / seconds, "load_s": load_s, "prompts": len(prompts), "new_tokens": new_tokens}


def measure_vllm(adapter_dir: Path | None, config, device, args) -> dict:
    """Time vLLM on the HF run's prompts with the DP-trained adapter (saved after the hooks mode)
    over a freshly saved random base."""
    reason = "dry run" if args.dry_run else vllm_unavailable(device)
    if reason is None and adapter_dir is None:
        reason = "no DP-trained adapter (run the hooks mode)"
    if reason:
        return {"measured": False, "reason": reason}
    import torch

    work = Path(tempfile.mkdtemp(prefix="dpsgd_gpu_vllm_"))
    save_random_base(config, work / "base")
    gen = torch.Generator().manual_seed(2)  # the prompts HF generation used
    ids = torch.randint(0, config.vocab_size, (args.gen_batch, 16), generator=gen).tolist()
    return {"measured": True, **vllm_generation_rate(work / "base", adapter_dir, ids, args.gen_tokens, args.lora_rank)}


# --- ACTG tiny with every model stage on one device ------------------------------------------------
def actg_config_on(path: Path, device: str, run_dir: Path):
    """The ACTG config at ``path`` with every causal-LM stage forced onto ``device``: DP-SGD
    (``generator``), generation, an LM reward judge, the RL policy. Embedding extractors (MiniLM)
    and the TF-IDF IFAcc judge run no causal LM and keep their own placement."""
    from dpsynth_core.actg.pipeline import ActgConfig, load_actg_config

    raw = load_actg_config(path).model_dump(mode="json", by_alias=True)
    raw["output_dir"] = str(run_dir)
    raw["generator"] = {**raw["generator"], "device": device}
    for section in ("generation", "rl"):
        raw[section] = {**raw[section], "device": device}
    for section in ("extractor", "reward"):
        if raw.get(section) and raw[section]["kind"] == "lm":
            raw[section] = {**raw[section], "device": device}
    return ActgConfig.model_validate(raw)


def actg_stage_devices(cfg) -> dict[str, str]:
    """Stage -> the device its causal LM is configured for (what the stage resolves at its entry)."""
    reward = cfg.reward or cfg.extractor
    return {"private (DP-SGD)": cfg.dpsgd_config(1.0).device, "generate": cfg.generation.device,
            "best_of_n (reward)": reward.device if reward.kind == "lm" else f"{reward.kind}: no causal LM",
            "anchored_rl": cfg.rl.device, "synthesize": cfg.generation.device}


def measure_actg(device, args) -> dict:
    """Run ACTG tiny with every model stage on ``device`` (a dry run builds and reports the plan only)."""
    if device.type != "cuda" and not args.dry_run:
        return {"measured": False, "reason": "no GPU (this figure is the GPU run; --dry-run checks the plan)"}
    if importlib.util.find_spec("dpsynth_core") is None:
        return {"measured": False, "reason": "dpsynth_core is not importable here"}
    run_dir = Path(tempfile.mkdtemp(prefix="dpsgd_gpu_actg_")) / "actg_tiny"
    try:
        cfg = actg_config_on(Path(args.actg_config), device.type, run_dir)
    except ImportError as exc:  # a GPU machine without the project's dependencies
        return {"measured": False, "reason": f"dpsynth_core's dependencies are missing ({exc})"}
    plan = {"config": str(args.actg_config), "stage_devices": actg_stage_devices(cfg)}
    if args.dry_run:
        return {"measured": False, "reason": "dry run", **plan}
    from dpsynth_core.actg.pipeline import RunDir, run_pipeline

    start = time.perf_counter()
    root = run_pipeline(cfg, resume=False)
    stages = {s: RunDir(root).summary(s).get("seconds") for s in cfg.stages}
    return {"measured": True, **plan, "stage_seconds": stages, "total_seconds": time.perf_counter() - start}
