"""The registry loads the embedded models from PyPI packages, offline, and caches them."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsynth_core.errors import ConfigError
from dpsynth_core.models import list_models, load_causal_lm, load_embedder, pull, resolve_model_dir


def test_tiny_llama_forward_pass():
    model, tokenizer = load_causal_lm("tiny-llama")
    batch = tokenizer(["hello world", "a longer second prompt here"], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model(**batch)
    assert out.logits.shape[:2] == batch["input_ids"].shape
    assert out.logits.shape[-1] == len(tokenizer)
    assert torch.isfinite(out.logits).all()
    assert tokenizer.padding_side == "left" and tokenizer.pad_token is not None


def test_tiny_llama_is_deterministic_and_cached():
    first = resolve_model_dir("tiny-llama")
    assert pull("tiny-llama") == first
    assert (first / "config.json").is_file() and list(first.glob("*.safetensors"))


def test_smollm2_generates_a_continuation():
    model, tokenizer = load_causal_lm("smollm2-135m-instruct")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    text = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert text.strip(), "empty continuation"
    assert "Paris" in text  # the real pretrained weights, not a random init


def test_cached_gguf_model_is_not_marked_quantized():
    """The cache holds float32 weights; a GGUF quantization_config left in it made trl refuse to train."""
    from transformers.trainer_utils import validate_quantization_for_training

    path = resolve_model_dir("smollm2-135m-instruct")
    assert "quantization_config" not in json.loads((path / "config.json").read_text())
    model, _ = load_causal_lm("smollm2-135m-instruct")
    assert not getattr(model, "is_quantized", False)
    validate_quantization_for_training(model)  # what transformers.Trainer runs; raised for GGUF


def test_smollm2_cached_load_is_plain_safetensors():
    path = resolve_model_dir("smollm2-135m-instruct")
    assert list(path.glob("*.safetensors")), "dequantized weights should be cached as safetensors"
    # a second process loads from the cache without opening the GGUF (no timing assertion here:
    # load times live in the closing notes and benchmarks, not in tests on a shared machine)
    code = (
        "import sys; opened = []\n"
        "sys.addaudithook(lambda e, a: opened.append(str(a[0])) if e == 'open' and a and isinstance(a[0], str) else None)\n"
        "from dpsynth_core.models import load_causal_lm\n"
        "model, tok = load_causal_lm('smollm2-135m-instruct')\n"
        "print(sum(p.numel() for p in model.parameters()), sum(o.endswith('.gguf') for o in opened),"
        " model.name_or_path)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    n_params, gguf_opened, loaded_from = out.stdout.strip().splitlines()[-1].split(maxsplit=2)
    assert int(n_params) > 100_000_000 and int(gguf_opened) == 0
    assert Path(loaded_from).resolve() == path.resolve()  # the cached safetensors directory


def test_minilm_embeddings_are_normalised_and_semantic():
    embedder = load_embedder("minilm")
    vectors = embedder.encode(["Neurons fire action potentials.", "Synapses transmit nerve signals.", "The stock market fell."])
    assert vectors.shape == (3, embedder.dim) == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


def test_unknown_model_gives_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="neither an embedded model"):
        resolve_model_dir("no-such-org/no-such-model-xyz")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model_dir(str(tmp_path / "empty"))


def test_list_models_names_the_embedded_ones():
    names = {spec.name for spec in list_models()}
    assert {"smollm2-135m-instruct", "gemma3-270m", "tiny-llama", "minilm"} <= names
