"""The 7B-shaped registry entry (issue 15.4): Llama-2-7B's shapes from its config, counted on the
meta device (no weights in RAM, no download); random weights only when asked."""

from __future__ import annotations

import pytest
import torch

from dpsynth_core.errors import ConfigError
from dpsynth_core.models import list_models, resolve_model_dir
from dpsynth_core.models.registry import build_random_causal_lm


def test_llama_7b_shapes_and_parameter_count_on_meta():
    model = build_random_causal_lm("llama-7b-random")
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.intermediate_size, cfg.vocab_size) == (
        4096, 32, 32, 11008, 32000)
    params = list(model.parameters())
    assert all(p.device.type == "meta" for p in params)  # nothing allocated
    n = sum(p.numel() for p in params)
    assert n == 6_738_415_616  # Llama-2-7B's published count
    q = model.model.layers[0].self_attn.q_proj.weight
    assert tuple(q.shape) == (4096, 4096) and q.dtype == torch.bfloat16


def test_lora_r16_on_qkvo_of_the_7b_shape():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(build_random_causal_lm("llama-7b-random"),
                           LoraConfig(r=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trainable == 32 * 4 * 16 * (4096 + 4096)  # 16.8M LoRA weights


def test_shape_only_names_are_listed_and_have_no_files():
    assert "llama-7b-random" in {s.name for s in list_models()}
    with pytest.raises(ConfigError, match="build_random_causal_lm"):
        resolve_model_dir("llama-7b-random")
    with pytest.raises(ConfigError, match="not a shape-only model"):
        build_random_causal_lm("tiny-llama")
