"""The GPU check's model and engine builders: a Llama-shaped causal LM with random weights built on
the device, a word-level tokenizer for it, rows of exact length, and the product's DP-SGD engine
(``dpsynth_core.dpsgd``) in each mode. Shared by ``gpu_check_parts.py`` and
``gpu_check_correctness.py``; the weights and rows are public noise, so fixed seeds are fine."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODES = ("nondp", "hooks", "ghost", "fsdp2")
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj"]

SHAPES = {
    "7b": dict(config=dict(vocab_size=32000), seq=512, batch=8, gen_tokens=64),  # dpsynth_core's llama_7b_config
    "tiny": dict(config=dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2), seq=64, batch=8, gen_tokens=8),
    # correctness checks: small enough for a float64 per-row reference, fp32 on any device
    "small": dict(config=dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2), seq=48, batch=8, gen_tokens=8),
}


# --- building blocks -------------------------------------------------------------------------------


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
