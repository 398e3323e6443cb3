"""The parts of the GPU check (``gpu_check.py`` runs each in its own process, under a time limit).

Every part drives the product's DP-SGD engine (``dpsynth_core.dpsgd.engine.DpSgdEngine`` and
``fsdp.FsdpDpSgdEngine``), never a replica of it, on a model with random weights built straight
on the device. Token ids come from a word-level tokenizer made here (the GPU machine has no
network and no tokenizer files); the weights and the "data" are public noise, so the fixed seeds
are fine. Each part writes its JSON after every measurement, so a part stopped at its time limit
still leaves what it measured.

    python benchmarks/gpu_check_parts.py env --json env.json
    python benchmarks/gpu_check_parts.py train --mode hooks --shape tiny --json hooks.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore", message=".*[Bb]ackward hook.*")
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", category=UserWarning, module="torch")

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODES = ("nondp", "hooks", "ghost", "fsdp2")
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]
PACKAGES = ("torch", "transformers", "peft", "accelerate", "opacus", "pydantic", "numpy", "tokenizers")
# Kept out of the DP-SGD import path, so the check needs no Ray, Serve, smartnoise or vLLM wheels.
HEAVY_MODULES = ("ray", "serving", "ray_jobs", "snsynth", "vllm", "sentence_transformers", "dp_accounting")

# name: (model config, sequence length, physical batch, tokens generated)
SHAPES = {
    "7b": dict(config=dict(vocab_size=32000), seq=512, batch=8, gen_tokens=64),  # dpsynth_core's llama_7b_config
    "tiny": dict(config=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2), seq=64, batch=8, gen_tokens=8),
    # correctness checks: small enough for a float64 per-row reference, fp32 on any device
    "small": dict(config=dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2), seq=48, batch=8, gen_tokens=8),
}


# --- building blocks -------------------------------------------------------------------------------
class Results:
    """A part's results, rewritten to disk after every update."""

    def __init__(self, path: str | None):
        self.path, self.data = path, {}

    def put(self, key: str, value) -> None:
        self.data[key] = value
        if self.path:
            tmp = f"{self.path}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(self.data, fh, indent=1)
            os.replace(tmp, self.path)


def device_and_dtype(shape: str):
    import torch

    if shape == "7b" and not torch.cuda.is_available():
        raise SystemExit("the 7B shape needs a GPU (use --shape tiny on the CPU)")
    # bf16 base on the CPU too: the rehearsal runs the same dtype path as the GPU
    return torch.device("cuda" if torch.cuda.is_available() else "cpu"), "bf16"


def word_tokenizer(vocab_size: int):
    """A word-level fast tokenizer over the words w0 .. w{V-4}, with pad, bos and eos."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i + 4 for i in range(vocab_size - 4)})
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                  unk_token="<unk>")
    tok.padding_side = "left"
    return tok


def random_base(shape: str, device, dtype: str, seed: int = 0, init_on_cpu: bool = False):
    """(Llama-shaped causal LM with random weights, tokenizer), built on ``device`` itself: a 7B
    model initialised on the CPU takes minutes. (Not meta + ``to_empty``: that leaves the rotary
    embedding's computed buffers uninitialised.) ``init_on_cpu``: the same weights as a CPU build
    (the CUDA generator draws other numbers), for comparisons with a CPU reference."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dpsynth_core.models.registry import llama_7b_config

    spec = SHAPES[shape]["config"]
    if shape == "7b":  # the registry's llama-7b-random architecture
        config = llama_7b_config()
    else:
        config = LlamaConfig(**spec, max_position_embeddings=4096, tie_word_embeddings=False, pad_token_id=0,
                             bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    with torch.device("cpu" if init_on_cpu else device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if dtype == "bf16" else torch.float32)
    return model.to(device), word_tokenizer(spec["vocab_size"])


def examples(n: int, seq: int, vocab: int, *, seed: int = 1, fixed_target: bool = False):
    """``n`` rows of exactly ``seq`` tokens (a 16-word prompt, the rest target, eos included).
    ``fixed_target``: every row's target repeats one word, a task a LoRA adapter can learn."""
    import numpy as np

    from dpsynth_core.dpsgd.config import TrainExample

    rng = np.random.default_rng(seed)
    prompt_len, target_len = min(16, seq // 2), seq - min(16, seq // 2) - 1
    words = lambda k: " ".join(f"w{int(i)}" for i in rng.integers(0, vocab - 4, k))  # noqa: E731
    if fixed_target:
        return [TrainExample(words(prompt_len), " ".join(["w7"] * target_len)) for _ in range(n)]
    return [TrainExample(words(prompt_len), words(target_len)) for _ in range(n)]


def dp_config(shape: str, *, dtype: str, device, clipping: str = "hooks", strategy: str = "ddp", n: int,
              batch: int, max_grad_norm: float = 1.0, lr: float = 1e-4, seq: int | None = None):
    from dpsynth_core.dpsgd.config import DpSgdConfig

    return DpSgdConfig(model=f"random-llama-{shape}", epsilon=1.0, steps=1, device=device.type, dtype=dtype,
                       clipping=clipping, gpu_strategy=strategy, expected_batch_size=n, physical_batch_size=batch,
                       max_seq_len=seq or SHAPES[shape]["seq"], max_grad_norm=max_grad_norm, learning_rate=lr,
                       lora={"r": 16, "alpha": 32, "target_modules": TARGET_MODULES})


def make_engine(mode: str, shape: str, device, dtype: str, rows, batch: int, *, sigma: float = 1.0,
                expected: int | None = None, init_on_cpu: bool = False, **config_kw):
    """The product's engine in ``mode``: nondp (one ordinary backward, no noise), hooks or ghost
    (``DpSgdEngine``), fsdp2 (``FsdpDpSgdEngine`` with ghost clipping, needs a process group).
    ``expected`` rows per logical step (default all: sampling rate 1, the same rows every step)."""
    from dpsynth_core.dpsgd.clipping import BatchGradientSum
    from dpsynth_core.dpsgd.engine import DistContext, DpSgdEngine

    clipping = "ghost" if mode in ("ghost", "fsdp2") else "hooks"
    cfg = dp_config(shape, dtype=dtype, device=device, clipping=clipping, strategy="fsdp2" if mode == "fsdp2" else "ddp",
                    n=expected or len(rows), batch=batch, **config_kw)
    base = random_base(shape, device, dtype, init_on_cpu=init_on_cpu)
    common = dict(sampling_seed=7, device=device, base=base)
    if mode == "fsdp2":
        from dpsynth_core.dpsgd.fsdp import FsdpDpSgdEngine

        init_process_group(device)
        return FsdpDpSgdEngine(rows, cfg, noise_multiplier=sigma, dist=DistContext(0, 1), **common)
    if mode == "nondp":
        return DpSgdEngine(rows, cfg, noise_multiplier=0.0, clipper_factory=BatchGradientSum, **common)
    return DpSgdEngine(rows, cfg, noise_multiplier=sigma, **common)


def init_process_group(device) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29500 + os.getpid() % 2000))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)


def free() -> None:
    """Return the memory of what the caller has just dropped (its references must be gone)."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(engine, device, steps: int, warmup: int) -> dict:
    """Tokens/s over ``steps`` logical steps after ``warmup``, and the peak GPU memory over them."""
    import torch

    for _ in range(warmup):
        engine.train_step()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if engine.sampler.sampling_rate != 1.0:
        raise ValueError("timed_steps counts every row in every step: build the engine with sampling rate 1")
    tokens = steps * sum(len(t.prompt_ids) + len(t.target_ids) for t in engine.tokenized)
    start = time.perf_counter()
    for _ in range(steps):
        engine.train_step()
    sync(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {"tokens_per_s": tokens / seconds, "peak_gib": peak, "tokens": tokens, "seconds": seconds}


def is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


# --- parts -----------------------------------------------------------------------------------------
def part_env(args, out: Results) -> int:
    """GPU, versions, and the engine's import path (light: no Ray, Serve, smartnoise, vLLM)."""
    import importlib.metadata as md
    import platform

    missing = []
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            missing.append(name)
    out.put("versions", versions)
    import torch

    gpu = None
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1), "cuda": torch.version.cuda,
               "capability": f"{props.major}.{props.minor}"}
    out.put("gpu", gpu)
    try:
        import dpsynth_core.dpsgd.engine  # noqa: F401
        import dpsynth_core.dpsgd.fsdp  # noqa: F401
        import opacus  # noqa: F401
    except ImportError as exc:
        missing.append(f"{exc.name} (imported by the engine)")
    heavy = sorted(m for m in HEAVY_MODULES if m in sys.modules)
    out.put("engine_imports_heavy_modules", heavy)
    out.put("missing", missing)
    if missing:
        print(f"gpu_check: missing {', '.join(missing)}: carry them as wheels (scripts/gpu_wheels.sh)", flush=True)
        return 3
    if heavy:
        print(f"gpu_check: the engine's import path pulls in {', '.join(heavy)}", flush=True)
        return 3
    if args.require_gpu and gpu is None:
        print("gpu_check: no GPU visible to torch", flush=True)
        return 3
    print(f"gpu_check env: {gpu['name'] if gpu else 'CPU'}; "
          + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
    return 0


def part_train(args, out: Results) -> int:
    """One mode at the shape's physical batch (the ratio figures), then the largest batch that fits."""
    device, dtype = device_and_dtype(args.shape)
    spec = SHAPES[args.shape]
    seq, batch, vocab = spec["seq"], spec["batch"], spec["config"]["vocab_size"]
    started = time.perf_counter()
    out.put("mode", args.mode)
    out.put("setup", {"shape": args.shape, "device": device.type, "base_dtype": dtype, "adapter_dtype": "fp32",
                      "seq": seq, "physical_batch": batch, "lora_r": 16, "lora_targets": TARGET_MODULES,
                      "logical_batch": 2 * batch, "sampling_rate": 1.0})
    # q = 1 over 2 * batch rows: every logical step is exactly two full physical batches, in every mode
    rows = examples(2 * batch, seq, vocab)
    t0 = time.perf_counter()
    engine = make_engine(args.mode, args.shape, device, dtype, rows, batch)
    sync(device)
    out.put("build_s", time.perf_counter() - t0)
    out.put("at_batch", {"batch": batch, **timed_steps(engine, device, steps=args.steps, warmup=1)})
    print(f"gpu_check {args.mode}: batch {batch} x {seq}: {out.data['at_batch']['tokens_per_s']:.0f} tokens/s", flush=True)
    if args.save_adapter:
        engine.save_adapter(args.save_adapter)
        out.put("adapter", args.save_adapter)
    engine = None
    free()
    largest, tried = None, []
    for b in args.search:
        if time.perf_counter() - started > args.search_budget_s:
            tried.append({"batch": b, "result": "not tried: time box"})
            break
        try:
            engine = make_engine(args.mode, args.shape, device, dtype, examples(b, seq, vocab), b)
            largest = {"batch": b, **timed_steps(engine, device, steps=1, warmup=1)}
            tried.append({"batch": b, "result": "fits"})
            out.put("largest_batch", largest)
        except Exception as exc:  # noqa: BLE001 - an OOM ends the search; anything else is a failure
            if not is_oom(exc):
                raise
            tried.append({"batch": b, "result": "out of memory"})
            out.put("search", tried)
            break
        finally:
            engine = None
            free()
        out.put("search", tried)
    out.put("search", tried)
    return 0


def part_generate(args, out: Results) -> int:
    """HF ``generate`` through the DP adapter: tokens/s at batch 1 and 32, unmerged, then merged."""
    import torch
    from peft import PeftModel

    device, dtype = device_and_dtype(args.shape)
    spec = SHAPES[args.shape]
    model, _ = random_base(args.shape, device, dtype)
    if args.adapter and Path(args.adapter, "adapter_config.json").is_file():
        model = PeftModel.from_pretrained(model, args.adapter)
        out.put("adapter", "DP-trained (hooks part)")
    else:  # the hooks part did not finish: an untrained adapter of the same shape costs the same
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGET_MODULES))
        out.put("adapter", "untrained (no DP-trained adapter was saved)")
    model.eval()
    model.config.use_cache = True
    new = spec["gen_tokens"]
    rows = {}
    for merged in (False, True):
        if merged:
            model = model.merge_and_unload()
        for batch in (1, 32):
            ids = torch.randint(4, spec["config"]["vocab_size"], (batch, 16), generator=torch.Generator().manual_seed(batch))
            ids = ids.to(device)
            with torch.no_grad():
                model.generate(input_ids=ids[:, :4], attention_mask=torch.ones_like(ids[:, :4]), max_new_tokens=2,
                               do_sample=True, pad_token_id=0)  # warm-up
                sync(device)
                start = time.perf_counter()
                gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                                     min_new_tokens=new, do_sample=True, top_k=0, pad_token_id=0)
                sync(device)
            seconds = time.perf_counter() - start
            key = f"{'merged' if merged else 'unmerged'}_batch{batch}"
            rows[key] = {"tokens_per_s": (gen.shape[1] - ids.shape[1]) * batch / seconds, "new_tokens": new,
                         "batch": batch}
            out.put("generation", rows)
            print(f"gpu_check generate {key}: {rows[key]['tokens_per_s']:.0f} tokens/s", flush=True)
    return 0


def part_profile(args, out: Results) -> int:
    """Where a logical step's time goes, per mode (``--modes``): torch.profiler over one step after a
    warm-up, the top operators by self device time and by self CPU time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    device, dtype = device_and_dtype(args.shape)
    spec = SHAPES[args.shape]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for mode in args.modes.split(","):
        if mode == "fsdp2":
            init_process_group(device)
        engine = make_engine(mode, args.shape, device, dtype, examples(2 * spec["batch"], spec["seq"],
                                                                         spec["config"]["vocab_size"]), spec["batch"])
        engine.train_step()
        sync(device)
        start = time.perf_counter()
        with profile(activities=activities) as prof:
            engine.train_step()
            sync(device)
        wall = time.perf_counter() - start
        events = prof.key_averages()
        device_key = "self_device_time_total" if hasattr(events[0], "self_device_time_total") else "self_cuda_time_total"
        top = lambda key: [{"op": e.key, "calls": e.count, "self_ms": getattr(e, key) / 1e3}  # noqa: E731
                           for e in sorted(events, key=lambda e: -getattr(e, key))[:15]]
        busy = sum(getattr(e, device_key) for e in events) / 1e6
        out.put(mode, {"step_wall_s": wall, "device_busy_s": busy, "top_device": top(device_key),
                       "top_cpu": top("self_cpu_time_total")})
        print(f"gpu_check profile {mode}: step {wall:.3f} s, device busy {busy:.3f} s", flush=True)
        print(events.table(sort_by=device_key if device.type == "cuda" else "self_cpu_time_total", row_limit=12),
              flush=True)
        engine = None
        free()
    return 0


def main(argv=None) -> int:
    from gpu_check_correctness import part_correctness

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("part", choices=["env", "correctness", "train", "generate", "profile"])
    ap.add_argument("--json", default=None, help="results file (rewritten after every measurement)")
    ap.add_argument("--shape", choices=["7b", "tiny"], default="tiny")
    ap.add_argument("--mode", choices=MODES, default="hooks")
    ap.add_argument("--steps", type=int, default=3, help="timed logical steps (two physical batches each)")
    ap.add_argument("--search", type=lambda s: [int(x) for x in s.split(",") if x], default=[],
                    help="physical batches to try, in order, until one runs out of memory")
    ap.add_argument("--search-budget-s", type=float, default=60.0, help="no new batch is tried after this")
    ap.add_argument("--save-adapter", default=None, help="train: save the adapter here (for the generate part)")
    ap.add_argument("--adapter", default=None, help="generate: the adapter the hooks part saved")
    ap.add_argument("--require-gpu", action="store_true")
    ap.add_argument("--modes", default="nondp,hooks", help="profile: the modes to profile")
    args = ap.parse_args(argv)
    out = Results(args.json)
    parts = {"env": part_env, "correctness": part_correctness, "train": part_train, "generate": part_generate,
             "profile": part_profile}
    return parts[args.part](args, out)


if __name__ == "__main__":
    sys.exit(main())
