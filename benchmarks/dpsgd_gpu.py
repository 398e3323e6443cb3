"""DP-SGD LoRA throughput and memory vs non-DP, in one run (issue 15, GPU figures).

Llama-7B-shaped model with random weights (no download), LoRA r=16 on q/k/v/o, sequence 512, bf16
base with fp32 LoRA weights, on one GPU. Modes, each on a fresh model, same batches:
  nondp      plain LoRA step (the reference)
  hooks      opacus per-sample gradients (GradSampleModule), clip, sum, noise
  ghost      opacus ghost clipping (two backward passes, no per-sample gradients)
  ghost_fsdp opacus ghost clipping on an FSDP2-sharded model at world size 1
Reported: tokens/s and peak GPU memory per mode, and both as ratios to nondp (printed as a table);
tokens/s of generation with the DP-trained adapter under HF ``generate`` and, where ``vllm`` imports,
under vLLM (LoRA request on the same random base); and the ACTG tiny pipeline with every model stage
forced onto the GPU (needs dpsynth_core and its dependencies; skipped with the reason otherwise).
The DP-SGD part needs only torch, transformers, peft and opacus (no Ray, no dpsynth_core), so it
runs on a bare GPU machine:

    python benchmarks/dpsgd_gpu.py --out results.json            # GPU: 7B shape, vLLM, ACTG tiny
    python benchmarks/dpsgd_gpu.py --tiny --out tiny.json        # CPU run of every mode at the tiny shape
    python benchmarks/dpsgd_gpu.py --dry-run                     # seconds: one step each, plans only

The random weights and token ids are public: DP randomness is irrelevant here; the noise draw only
makes the DP step cost what it costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
import warnings

import torch

# opacus' hooks on frozen-input modules and ghost clipping's retain_graph: benign, and noisy
warnings.filterwarnings("ignore", message=".*[Bb]ackward hook.*")
warnings.filterwarnings("ignore", category=UserWarning, module="torch.autograd")
warnings.filterwarnings("ignore", category=FutureWarning, module="transformers")  # deprecation notes of HF internals

MODES = ("nondp", "hooks", "ghost", "ghost_fsdp")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def model_config(tiny: bool):
    from transformers import LlamaConfig

    if tiny:
        return LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)
    # Llama-2-7B (same as dpsynth_core.models.registry.llama_7b_config, repeated: no dpsynth import here)
    return LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                       tie_word_embeddings=False)


def build_model(config, device, dtype, rank: int):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        base = AutoModelForCausalLM.from_config(config, dtype=dtype)
    base.config.use_cache = False
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=TARGETS))
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
        if p.requires_grad:
            p.data = p.data.float()  # fp32 master weights for the adapter
    model.train()
    return model


def per_row_loss(logits, ids):
    shift, target = logits[:, :-1].float(), ids[:, 1:]
    tok = torch.nn.functional.cross_entropy(shift.reshape(-1, shift.shape[-1]), target.reshape(-1), reduction="none")
    return tok.view(target.shape).mean(dim=1)


def _forward(module, ids):
    positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[0], -1)  # per-row (opacus)
    return module(input_ids=ids, position_ids=positions).logits


class _ZeroGrad:
    def __init__(self, params):
        self.params = params

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


def _local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def make_step(mode: str, model, clip: float, sigma: float, batch: int):
    """A function ids -> None that runs one optimizer step of ``mode``."""
    params = [p for p in model.parameters() if p.requires_grad]
    if mode == "ghost_fsdp":
        from opacus.grad_sample.grad_sample_module_fast_gradient_clipping_fsdp import (
            GradSampleModuleFastGradientClippingFSDP,
        )
        from opacus.utils.fsdp_utils import FSDP2Wrapper

        model = FSDP2Wrapper(model)
        params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def noise_and_step():
        for p in params:
            g = _local(p.grad)
            g.add_(torch.randn_like(g) * sigma * clip).div_(batch)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if mode == "nondp":
        def step(ids):
            per_row_loss(_forward(model, ids), ids).sum().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return step
    if mode == "hooks":
        from opacus import GradSampleModule

        gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=False)

        def step(ids):
            per_row_loss(_forward(gsm, ids), ids).sum().backward()
            norms = torch.stack([p.grad_sample.reshape(len(ids), -1).norm(dim=1) for p in params], 1).norm(dim=1)
            factors = (clip / (norms + 1e-6)).clamp(max=1.0)
            for p in params:
                p.grad = torch.einsum("i,i...->...", factors.to(p.grad_sample.dtype), p.grad_sample)
                p.grad_sample = None
            noise_and_step()
        return step
    from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping

    if mode == "ghost":
        from opacus.grad_sample import GradSampleModuleFastGradientClipping

        gsm = GradSampleModuleFastGradientClipping(model, batch_first=True, loss_reduction="sum", max_grad_norm=clip,
                                                   use_ghost_clipping=True, strict=False)
    else:
        gsm = GradSampleModuleFastGradientClippingFSDP(model, batch_first=True, loss_reduction="sum",
                                                       max_grad_norm=clip, strict=False)
    zero = _ZeroGrad(params)

    def step(ids):
        losses = per_row_loss(_forward(gsm, ids), ids)
        DPTensorFastGradientClipping(gsm, zero, losses, loss_reduction="sum").backward()
        noise_and_step()
    return step, model


def run_mode(mode, args, config, device, dtype):
    model = build_model(config, device, dtype, args.lora_rank)
    made = make_step(mode, model, clip=1.0, sigma=1.0, batch=args.batch)
    step, model = made if isinstance(made, tuple) else (made, model)
    gen = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, config.vocab_size, (args.batch, args.seq), generator=gen).to(device)
               for _ in range(args.warmup + args.steps)]
    for ids in batches[: args.warmup]:
        step(ids)
    _sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for ids in batches[args.warmup:]:
        step(ids)
    _sync(device)
    seconds = time.perf_counter() - start
    row = {"mode": mode, "tokens_per_s": args.batch * args.seq * args.steps / seconds,
           "peak_gpu_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None}
    return row, model


def generation_rate(model, config, device, args) -> float:
    model.eval()
    base = model.module if hasattr(model, "_module") else model
    ids = torch.randint(0, config.vocab_size, (args.gen_batch, 16), generator=torch.Generator().manual_seed(2)).to(device)
    base.config.use_cache = True
    with torch.no_grad():
        _sync(device)
        start = time.perf_counter()
        out = base.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.gen_tokens,
                            min_new_tokens=args.gen_tokens, do_sample=True, pad_token_id=0)
        _sync(device)
    return (out.shape[1] - ids.shape[1]) * args.gen_batch / (time.perf_counter() - start)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _init_single_process_group(device) -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 1000))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny shape on CPU fp32 (smoke run of every mode)")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shape, one step per mode, no vLLM and only the ACTG plan: checks the wiring in seconds")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--batch", type=int, default=None, help="physical batch (default 8 on GPU, 4 tiny)")
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=None)
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--gen-batch", type=int, default=None)
    ap.add_argument("--gen-tokens", type=int, default=None)
    ap.add_argument("--actg-config", default=None, help="ACTG config run with every model stage on the device "
                    "(default configs/actg_tiny.yaml)")
    ap.add_argument("--no-actg", action="store_true", help="skip the ACTG pipeline")
    ap.add_argument("--out", default=None, help="JSON results file")
    args = ap.parse_args(argv)
    args.tiny = args.tiny or args.dry_run
    if args.dry_run:
        defaults = dict(batch=2, seq=16, steps=1, warmup=0, gen_batch=2, gen_tokens=4)
    elif args.tiny:
        defaults = dict(batch=4, seq=32, steps=2, warmup=1, gen_batch=2, gen_tokens=8)
    else:
        defaults = dict(batch=8, seq=512, steps=10, warmup=2, gen_batch=16, gen_tokens=128)
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def ratio_table(rows: list[dict]) -> str:
    """The figures the issue asks for, as ratios to nondp measured in this one run."""
    lines = [f"{'mode':>10}  {'tokens/s':>10}  {'vs nondp':>8}  {'peak GiB':>9}  {'vs nondp':>8}"]
    for r in rows:
        peak = "-" if r["peak_gpu_gib"] is None else f"{r['peak_gpu_gib']:.2f}"
        tps_ratio = "-" if r["tokens_per_s_vs_nondp"] is None else f"{r['tokens_per_s_vs_nondp']:.3f}"
        mem_ratio = "-" if r["peak_mem_vs_nondp"] is None else f"{r['peak_mem_vs_nondp']:.3f}"
        lines.append(f"{r['mode']:>10}  {r['tokens_per_s']:>10.1f}  {tps_ratio:>8}  {peak:>9}  {mem_ratio:>8}")
    lines.append("targets (issue 15): DP tokens/s >= 0.85x nondp, DP peak memory <= 1.1x nondp")
    return "\n".join(lines)


def main(argv=None) -> int:
    import gpu_stages

    args = parse_args(argv)
    if not args.tiny and not torch.cuda.is_available():
        print("no GPU visible: the 7B shape needs one (use --tiny or --dry-run on CPU)", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = model_config(args.tiny)
    modes = [m for m in args.modes.split(",") if m]
    if "ghost_fsdp" in modes:
        _init_single_process_group(device)
    rows, gen_tps, adapter_dir = [], None, None
    for mode in modes:
        row, model = run_mode(mode, args, config, device, dtype)
        if mode == "hooks" or (gen_tps is None and mode == modes[-1] and mode != "ghost_fsdp"):
            gen_tps = generation_rate(model, config, device, args)
            if mode == "hooks" and not args.dry_run:  # vLLM serves this DP-trained adapter later
                adapter_dir = os.path.join(tempfile.mkdtemp(prefix="dpsgd_gpu_adapter_"), "adapter")
                model.save_pretrained(adapter_dir)
        rows.append(row)
        del model
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ref = next((r for r in rows if r["mode"] == "nondp"), None)
    for r in rows:
        r["tokens_per_s_vs_nondp"] = r["tokens_per_s"] / ref["tokens_per_s"] if ref else None
        r["peak_mem_vs_nondp"] = (r["peak_gpu_gib"] / ref["peak_gpu_gib"]) if ref and ref["peak_gpu_gib"] else None
    print(ratio_table(rows), flush=True)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    vllm = gpu_stages.measure_vllm(adapter_dir, config, device, args)
    generation = {"hf_tokens_per_s": gen_tps, "vllm": vllm,
                  "vllm_vs_hf": vllm["tokens_per_s"] / gen_tps if vllm.get("measured") and gen_tps else None}
    print(f"generation with the DP adapter: HF {gen_tps:.1f} tokens/s; vLLM "
          + (f"{vllm['tokens_per_s']:.1f} tokens/s ({generation['vllm_vs_hf']:.2f}x HF)" if vllm.get("measured")
             else f"not measured ({vllm['reason']})"), flush=True)
    actg = {"measured": False, "reason": "--no-actg"}
    if not args.no_actg:
        args.actg_config = args.actg_config or str(gpu_stages.ACTG_TINY)
        try:
            actg = gpu_stages.measure_actg(device, args)
        except Exception as exc:  # the DP-SGD figures above stand on their own: record why this one failed
            actg = {"measured": False, "reason": f"{type(exc).__name__}: {exc}"}
    print("ACTG with every model stage on " + device.type + ": "
          + (f"{actg['total_seconds']:.1f} s {actg['stage_seconds']}" if actg.get("measured")
             else f"not measured ({actg['reason']}); plan {actg.get('stage_devices')}"), flush=True)
    result = {"shape": "tiny" if args.tiny else "llama-7b", "device": str(device), "dtype": str(dtype),
              "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None, "dry_run": args.dry_run,
              "batch": args.batch, "seq": args.seq, "steps": args.steps, "lora_rank": args.lora_rank,
              "modes": rows, "generation_tokens_per_s_with_dp_adapter": gen_tps, "generation": generation,
              "actg": actg}
    if args.out:
        with open(args.out, "w", encoding="utf-8") as fh:
            json.dump(result, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
