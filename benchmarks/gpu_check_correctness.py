"""The GPU check's correctness part: the product's engine computes what DP-SGD says, on the device.

1. clipped sums: for each clipping mode (hooks, ghost, and ghost under FSDP2 at world size 1), the
   engine's sum of per-row clipped LoRA gradients equals a float64 per-row reference (one autograd
   call per row, clipped, summed) within 1e-5 relative, with the clip bound at the median norm so
   half the rows are clipped;
2. noise: the engine's noisy gradient minus its noise-free twin (same rows, same weights), times
   the expected batch, has standard deviation sigma * C within 5 % and mean ~0 -- noise added once
   (twice would give sqrt(2) sigma * C);
3. learning: 20 DP steps on a task an adapter can learn lower the loss by >= 20 %, and the LoRA
   weights moved (opacus#820: adapters that silently never update).
"""

from __future__ import annotations

import math
import re

from gpu_check_model import SHAPES, TARGET_MODULES, examples, init_process_group, make_engine, random_base

CLIP_RTOL = 1e-5
NOISE_TOL = 0.05
LOSS_DROP = 0.20
_KEY = re.compile(r"layers\.(\d+)\.self_attn\.(\w+_proj)\.lora_([AB])")


def canonical(name: str) -> tuple[int, str, str]:
    """(layer, projection, A|B) of a LoRA parameter, whatever prefix peft, opacus or FSDP gave it."""
    found = _KEY.search(name)
    if not found:
        raise ValueError(f"not a LoRA parameter name: {name}")
    layer, proj, ab = found.groups()
    return int(layer), proj, ab


def lora_values(shapes: dict[tuple, tuple]) -> dict[tuple, object]:
    """Fixed non-zero LoRA weights (peft starts B at zero, which would leave A without gradient)."""
    import torch

    out = {}
    for i, key in enumerate(sorted(shapes)):
        out[key] = torch.randn(shapes[key], generator=torch.Generator().manual_seed(1000 + i), dtype=torch.float64) * 0.05
    return out


def set_engine_lora(engine, values) -> None:
    """Load ``values`` through the engine's own ``load_adapter_state`` (sharded under FSDP)."""
    state = engine.adapter_state()
    engine.load_adapter_state({k: values[canonical(k)].to(v.dtype) for k, v in state.items()})


def engine_lora_names(engine) -> list[str]:
    names = getattr(engine, "_names", None)  # FSDP engine: names of the sharded parameters
    return names or [n for n, p in engine.model.named_parameters() if p.requires_grad]


def reference(rows, tokenizer, values, clip: float | None, seq: int):
    """Float64 per-row gradients of the product's per-row loss, on the CPU: their norms and the
    sum of the clipped ones (``clip`` None: norms only)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from dpsynth_core.dpsgd.data import IGNORE_INDEX, collate, tokenize_examples

    base, _ = random_base("small", torch.device("cpu"), "fp32")
    model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, target_modules=TARGET_MODULES)).double()
    params = {}
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
        if "lora_" in name:
            params[canonical(name)] = p
    with torch.no_grad():
        for key, p in params.items():
            p.copy_(values[key])
    keys = sorted(params)
    norms, total = [], {k: torch.zeros_like(params[k]) for k in keys}
    for row in tokenize_examples(rows, tokenizer, seq):
        batch = collate([row], pad_id=0)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits.double()
        labels = torch.full_like(batch["labels"], IGNORE_INDEX)
        labels[:, :-1] = batch["labels"][:, 1:]
        valid = labels != IGNORE_INDEX
        loss = torch.nn.functional.cross_entropy(logits[valid], labels[valid], reduction="mean")
        grads = torch.autograd.grad(loss, [params[k] for k in keys])
        norm = torch.sqrt(sum((g * g).sum() for g in grads))
        norms.append(float(norm))
        if clip is not None:
            factor = min(1.0, clip / (float(norm) + 1e-6))
            for k, g in zip(keys, grads):
                total[k] += factor * g
    return norms, total


def check(name: str, value: float, bound: str, passed: bool, **extra) -> dict:
    row = {"check": name, "value": value, "bound": bound, "passed": bool(passed), **extra}
    print(f"gpu_check correctness {'PASS' if passed else 'FAIL'}: {name} = {value:.3g} ({bound})", flush=True)
    return row


def clipped_sum_checks(device, modes) -> list[dict]:
    import torch

    spec = SHAPES["small"]
    rows = examples(8, spec["seq"], spec["config"]["vocab_size"], seed=3)
    probe = make_engine("hooks", "small", device, "fp32", rows, 4, sigma=0.0, init_on_cpu=True)
    shapes = {canonical(k): tuple(v.shape) for k, v in probe.adapter_state().items()}
    tokenizer = probe.tokenizer
    del probe
    values = lora_values(shapes)
    norms, _ = reference(rows, tokenizer, values, None, spec["seq"])
    clip = sorted(norms)[len(norms) // 2]
    _, ref_sum = reference(rows, tokenizer, values, clip, spec["seq"])
    ref_flat = torch.cat([ref_sum[k].reshape(-1) for k in sorted(ref_sum)])
    out = []
    for mode in modes:
        engine = make_engine(mode, "small", device, "fp32", rows, 4, sigma=0.0, max_grad_norm=clip, init_on_cpu=True)
        set_engine_lora(engine, values)
        buffers, _, n_units = engine.clipped_sum([[i] for i in range(len(rows))])
        got = dict(zip([canonical(n) for n in engine_lora_names(engine)], buffers))
        got_flat = torch.cat([got[k].double().cpu().reshape(-1) for k in sorted(ref_sum)])
        rel = float((got_flat - ref_flat).norm() / ref_flat.norm())
        clipped = sum(n > clip for n in norms)
        out.append(check(f"clipped sum vs float64 reference ({mode})", rel, f"relative error <= {CLIP_RTOL:g}",
                         rel <= CLIP_RTOL and n_units == len(rows), rows=len(rows), rows_clipped=clipped, clip=clip))
        del engine
    return out


def noise_checks(device, modes) -> list[dict]:
    """Noisy minus noise-free gradient of the same step: pure noise / B, std sigma * C."""
    import torch

    spec = SHAPES["small"]
    rows = examples(8, spec["seq"], spec["config"]["vocab_size"], seed=4)
    sigma, clip = 1.3, 0.7
    out = []
    for mode in modes:
        grads = {}
        for s in (sigma, 0.0):
            engine = make_engine(mode, "small", device, "fp32", rows, 4, sigma=s, max_grad_norm=clip)
            grads[s] = torch.cat([g.double().cpu().reshape(-1) for g in engine.noisy_gradients()[0]])
            batch = engine.config.expected_batch_size
            del engine
        noise = (grads[sigma] - grads[0.0]) * batch
        ratio = float(noise.std() / (sigma * clip))
        z_mean = float(noise.mean() / (sigma * clip) * math.sqrt(noise.numel()))
        out.append(check(f"noise std / (sigma C) ({mode})", ratio, f"within {NOISE_TOL:.0%} of 1, mean within 5 se of 0",
                         abs(ratio - 1) <= NOISE_TOL and abs(z_mean) <= 5, coordinates=noise.numel(), mean_z=z_mean,
                         sigma=sigma, clip=clip))
    return out


def learning_check(device) -> list[dict]:
    """A fixed target after random prompts: learnable by the adapter, under DP noise."""
    spec = SHAPES["small"]
    rows = examples(64, spec["seq"], spec["config"]["vocab_size"], seed=5, fixed_target=True)
    engine = make_engine("hooks", "small", device, "fp32", rows, 8, sigma=0.5, expected=16, max_grad_norm=1.0,
                         lr=1e-2)  # sampling rate 1/4
    before = {k: v.clone() for k, v in engine.adapter_state().items()}
    losses = [engine.train_step()["loss"] for _ in range(20)]
    moved = max(float((engine.adapter_state()[k] - v).abs().max()) for k, v in before.items() if "lora_B" in k)
    first, last = losses[0], sum(losses[-3:]) / 3
    drop = 1 - last / first
    return [check("loss drop over 20 DP steps", drop, f">= {LOSS_DROP:.0%}", drop >= LOSS_DROP,
                  first_loss=first, last3_loss=last, losses=losses),
            check("largest change of a lora_B weight in 20 steps", moved, "> 0 (opacus#820)", moved > 0)]


def part_correctness(args, out) -> int:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False  # fp32 means fp32 for the comparison
    torch.backends.cudnn.allow_tf32 = False
    modes = ["hooks", "ghost"]
    try:
        init_process_group(device)
        modes.append("fsdp2")
    except Exception as exc:  # noqa: BLE001 - reported, and the other modes are still checked
        out.put("fsdp2_skipped", f"{type(exc).__name__}: {exc}")
    checks = []
    for name, run in (("clipped sums", lambda: clipped_sum_checks(device, modes)),
                      ("noise", lambda: noise_checks(device, modes)), ("learning", lambda: learning_check(device))):
        checks.extend(run())
        out.put("device", device.type)
        out.put("checks", checks)
    return 0 if all(c["passed"] for c in checks) else 1
