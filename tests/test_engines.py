"""The generation engines: HF (always), vLLM (installed by `make install`; skipped only where it could not
be, and failed under CI=true: tests/vllm_gate.py). The vLLM checks load SmolLM2 in vLLM and in HF.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_gate import require_vllm
from pydantic import ValidationError

from dpsynth_core.engines import EngineConfig, SamplingParams, cut_at_stop, load_engine, resolve_backend
from dpsynth_core.engines import factory
from dpsynth_core.errors import ConfigError

PROMPTS = ["The capital of France is", "Proteins fold because"]


@pytest.fixture(scope="module")
def tiny_hf():
    with load_engine(EngineConfig(model="tiny-llama", backend="hf")) as engine:
        yield engine


def stop_inside(text: str) -> str:
    """A stop string taken from the middle of ``text`` (non-blank, so stripping cannot hide it)."""
    for start in range(len(text) // 2, len(text) - 2):
        if not any(c.isspace() for c in text[start:start + 3]):
            return text[start:start + 3]
    raise AssertionError(f"no 3 non-blank characters after the middle of {text!r}: pick another prompt")


def check_stop(engine, prompt: str) -> None:
    greedy = SamplingParams(max_new_tokens=16, temperature=0)
    [full] = engine.generate([prompt], greedy)
    stop = stop_inside(full)
    [cut] = engine.generate([prompt], greedy.model_copy(update={"stop": (stop,)}))
    assert cut == full[:full.find(stop)].strip()
    assert stop not in cut and len(cut) < len(full)


def check_n_samples(engine) -> None:
    params = SamplingParams(max_new_tokens=8, temperature=1.0, n=3, seed=11)
    batch = engine.run(PROMPTS, params)
    assert len(batch.texts) == 6 and [len(g) for g in batch.grouped()] == [3, 3]
    assert len(batch.latencies_s) == 2 and all(t > 0 for t in batch.new_tokens)
    assert len(set(batch.grouped()[0])) > 1  # n samples, not one sample repeated
    assert engine.generate(PROMPTS, params) == batch.texts  # a post-processing seed reproduces


def test_lora_mode_auto_merges_on_cpu_and_keeps_lora_kernels_on_gpu() -> None:
    assert EngineConfig().lora_mode == "auto"
    assert EngineConfig().lora_mode_on("cpu") == "merged" and EngineConfig().lora_mode_on("cuda") == "lora"
    assert EngineConfig(lora_mode="lora").lora_mode_on("cpu") == "lora"
    assert EngineConfig(lora_mode="merged").lora_mode_on("cuda") == "merged"
    with pytest.raises(ValidationError):
        EngineConfig(lora_mode="fused")


def test_cut_at_stop_takes_the_earliest_stop() -> None:
    assert cut_at_stop("a. b\n\nc", [".", "\n\n"]) == "a"
    assert cut_at_stop("abc", ["x"]) == "abc"


def test_sampling_params_reject_empty_stop_and_unknown_keys() -> None:
    with pytest.raises(ValidationError, match="stop"):
        SamplingParams(stop=("",))
    with pytest.raises(ValidationError):
        SamplingParams(max_tokens=5)


@pytest.mark.parametrize("name", ["engine_smollm2.yaml", "engine_hf_tiny.yaml"])
def test_engine_configs_load(name: str) -> None:
    from dpsynth_core.config import load_config

    config = load_config(Path(__file__).resolve().parent.parent / "configs" / name, EngineConfig)
    assert config.backend in {"auto", "hf"} and config.model


def test_hf_engine_samples_n_per_prompt(tiny_hf) -> None:
    check_n_samples(tiny_hf)


def test_hf_engine_cuts_at_stop_string(tiny_hf) -> None:
    check_stop(tiny_hf, PROMPTS[0])


def test_auto_falls_back_to_hf_without_vllm(monkeypatch) -> None:
    monkeypatch.setattr(factory, "vllm_installed", lambda: False)
    assert resolve_backend(EngineConfig(model="tiny-llama")) == "hf"
    with pytest.raises(ConfigError, match="not installed"):
        resolve_backend(EngineConfig(model="tiny-llama", backend="vllm"))


def test_auto_skips_vllm_for_head_sizes_its_cpu_kernels_lack(monkeypatch) -> None:
    # tiny-llama: hidden 64 over 4 heads = head size 16, which vLLM's CPU attention does not implement.
    monkeypatch.setattr(factory, "vllm_installed", lambda: True)
    monkeypatch.setattr(factory, "_vllm_architectures", lambda: frozenset({"LlamaForCausalLM"}))
    monkeypatch.setattr(factory, "_on_cuda", lambda: False)
    assert "head size 16" in factory.vllm_unsupported_reason("tiny-llama")
    assert resolve_backend(EngineConfig(model="tiny-llama")) == "hf"


def test_auto_fallback_says_why_in_one_line(monkeypatch, caplog) -> None:
    monkeypatch.setattr(factory, "vllm_installed", lambda: False)
    factory._announce_fallback.cache_clear()
    with caplog.at_level("WARNING", logger="dpsynth_core.engines.factory"):
        for _ in range(3):
            resolve_backend(EngineConfig(model="tiny-llama"))
    [line] = [r.getMessage() for r in caplog.records]
    assert "hf for model 'tiny-llama'" in line and "not installed" in line


def test_auto_choosing_vllm_says_so_in_one_line(monkeypatch, caplog) -> None:
    monkeypatch.setattr(factory, "vllm_unsupported_reason", lambda model, device=None: None)
    factory._announce_vllm.cache_clear()
    with caplog.at_level("WARNING", logger="dpsynth_core.engines.factory"):
        for _ in range(3):
            assert resolve_backend(EngineConfig(model="tiny-llama")) == "vllm"
    assert [r.getMessage() for r in caplog.records] == ["generation engine: vllm for model 'tiny-llama'"]


def test_actg_generation_runs_through_the_engine(tiny_hf) -> None:
    from dpsynth_core.actg.generator import GenerationSettings, generate_texts

    settings = GenerationSettings(max_new_tokens=6, seed=3, engine="hf")
    out = generate_texts(tiny_hf, None, PROMPTS, settings, n=2, progress=False)
    assert [len(c) for c in out] == [2, 2] and all(isinstance(t, str) for c in out for t in c)
    assert generate_texts(tiny_hf, None, PROMPTS, settings, n=2, progress=False) == out


def test_pe_plm_runs_through_the_engine() -> None:
    from dpsynth_core.pe.llm import LocalLLM

    llm = LocalLLM("tiny-llama", engine="hf", batch_size=2)
    try:
        assert llm.engine.backend == "hf"
        params = SamplingParams(max_new_tokens=5, seed=4)
        out = llm.generate(PROMPTS * 2, params)
        assert len(out) == 4 and out == llm.generate(PROMPTS * 2, params)
    finally:
        llm.close()


def test_hf_engine_refuses_regex(tiny_hf) -> None:
    with pytest.raises(ConfigError, match="vllm"):
        tiny_hf.run(PROMPTS, SamplingParams(regex="a+"))


# --- vLLM (installed by make install; skipped only where it could not be, failed under CI) ----------

SMOLLM2 = "smollm2-135m-instruct"
SHORT_PROMPTS = ["The capital of France is", "Write one sentence about cells.", "1, 2, 3,", "Dear Sir,"]


@pytest.fixture(scope="module")
def smollm2_adapter(tmp_path_factory):
    """A LoRA adapter on SmolLM2 in the DP-SGD adapter's format (q_proj/v_proj), with random B so it
    changes the output (peft's default B = 0 would make every comparison trivially pass)."""
    require_vllm()
    import torch
    from peft import LoraConfig, get_peft_model

    from dpsynth_core.models import load_causal_lm

    model, _ = load_causal_lm(SMOLLM2)
    torch.manual_seed(0)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    out = tmp_path_factory.mktemp("adapter")
    get_peft_model(model, config).save_pretrained(str(out))
    return out


@pytest.fixture(scope="module")
def vllm_fp32(smollm2_adapter):
    with load_engine(EngineConfig(model=SMOLLM2, adapter_dir=smollm2_adapter, backend="vllm", dtype="float32",
                                  kv_cache_gib=1, max_num_seqs=16, max_model_len=256)) as engine:
        yield engine


def test_vllm_with_dp_adapter_matches_hf_greedy(vllm_fp32, smollm2_adapter) -> None:
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    with load_engine(EngineConfig(model=SMOLLM2, adapter_dir=smollm2_adapter, backend="hf")) as hf:
        hf_texts = hf.generate(SHORT_PROMPTS, greedy)
    with load_engine(EngineConfig(model=SMOLLM2, backend="hf")) as base:
        base_texts = base.generate(SHORT_PROMPTS, greedy)
    assert hf_texts != base_texts  # the adapter matters, so agreement below is not the base model's
    assert vllm_fp32.generate(SHORT_PROMPTS, greedy) == hf_texts


def test_vllm_samples_n_per_prompt_and_stops(vllm_fp32) -> None:
    check_n_samples(vllm_fp32)
    check_stop(vllm_fp32, SHORT_PROMPTS[1])


def test_vllm_lora_kernels_match_the_merged_copy(vllm_fp32) -> None:
    """On CPU ``lora_mode: auto`` serves a merged copy (the fixture); the merged copy is the engine's own,
    gone when it closes; vLLM's LoRA path then decodes the same tokens. The module's last use of the
    fixture: it closes it first, so the LoRA engine runs its core in this process instead of spawning one."""
    assert vllm_fp32.lora is None and Path(vllm_fp32._merged.name, "model", "config.json").is_file()
    greedy = SamplingParams(max_new_tokens=12, temperature=0)
    merged_texts = vllm_fp32.generate(SHORT_PROMPTS, greedy)
    copy = Path(vllm_fp32._merged.name)
    vllm_fp32.close()
    assert not copy.exists()
    with load_engine(vllm_fp32.config.model_copy(update={"lora_mode": "lora"})) as lora:
        assert lora.lora is not None and lora._merged is None
        assert lora.generate(SHORT_PROMPTS, greedy) == merged_texts


def test_a_missing_vllm_fails_the_vllm_tests_under_ci_and_skips_them_elsewhere(monkeypatch):
    import importlib.util

    import vllm_gate

    real = importlib.util.find_spec
    monkeypatch.setattr(vllm_gate.importlib.util, "find_spec", lambda name: None if name == "vllm" else real(name))
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: vllm not importable"):
        vllm_gate.require_vllm()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="make install"):
        vllm_gate.require_vllm()


def test_hf_rows_keep_their_own_parameters_and_seed_in_a_mixed_batch(tiny_hf) -> None:
    """Serve's HF replicas batch rows of different requests: a seeded row decodes the same whatever the
    parameters and seed of its batch mate (a mate with top_p < 1 used to sort every row's CDF), and each row
    stops at its own budget. Same batch shape in both: a random tiny model's near-flat distribution would
    let another batch size's rounding flip a draw."""
    from dpsynth_core.engines.hf_rows import DecodeRow

    ids = tiny_hf.tokenizer(PROMPTS[0])["input_ids"]
    row = DecodeRow(ids, SamplingParams(max_new_tokens=6, temperature=1.0, seed=5))
    mate = DecodeRow(ids, SamplingParams(max_new_tokens=2, temperature=0.7, top_p=0.9, seed=9))
    other_mate = DecodeRow(ids, SamplingParams(max_new_tokens=6, temperature=1.3, seed=123))
    mixed = tiny_hf.decode_rows([row, mate])
    beside_other = tiny_hf.decode_rows([row, other_mate])
    assert mixed[0].token_ids == beside_other[0].token_ids and len(mixed[0].token_ids) >= 1
    assert beside_other[1].token_ids != mixed[0].token_ids  # the mate's own seed: its own draws
    assert len(mixed[1].token_ids) <= 2 and mixed[1].finish_reason in ("stop", "length")
    with pytest.raises(ValueError, match="own seed"):
        tiny_hf.decode_rows([DecodeRow(ids, SamplingParams(max_new_tokens=2))])


def test_hf_engine_generates_under_a_logits_processor_in_one_call(tiny_hf) -> None:
    import torch

    token = tiny_hf.tokenizer("hello", add_special_tokens=False)["input_ids"][0]
    seen: list[int] = []

    def only_one_token(input_ids, scores):
        seen.append(input_ids.shape[0])
        forced = torch.full_like(scores, float("-inf"))
        forced[:, token] = 0.0
        return forced

    params = SamplingParams(max_new_tokens=3, temperature=1.0, seed=1)
    texts = tiny_hf.generate_processed(PROMPTS, params, [only_one_token])
    expected = tiny_hf.tokenizer.decode([token] * 3, skip_special_tokens=True).strip()
    assert texts == [expected] * len(PROMPTS) and set(seen) == {len(PROMPTS)}  # every row, one batch
    with pytest.raises(ConfigError, match="n = 1"):
        tiny_hf.generate_processed(PROMPTS, params.model_copy(update={"n": 2}), [only_one_token])


def test_only_the_engines_call_hf_generate() -> None:
    """Every generation of the library, the Ray drivers, Serve and the CLI goes through dpsynth_core/engines:
    no other module calls a model's ``generate`` (a call with ``max_new_tokens=`` or ``**`` keywords)."""
    import ast

    root = Path(__file__).resolve().parent.parent
    offenders = []
    for path in sorted(p for package in ("dpsynth_core", "ray_jobs", "serving", "dpsynth")
                       for p in (root / package).rglob("*.py")):
        if "engines" in path.relative_to(root).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "generate":
                if any(k.arg in (None, "max_new_tokens", "input_ids") for k in node.keywords):
                    offenders.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not offenders, f"HF generate outside dpsynth_core/engines: {offenders}"


def test_serve_vllm_replicas_convert_their_rows_through_the_engines_parameters() -> None:
    """Serve's vLLM replica and the offline vLLM engine build vLLM's request parameters in one place
    (engines.vllm_engine.vllm_sampling): a Serve row's budget, sampling, stop strings and seed reach vLLM."""
    require_vllm()
    import asyncio
    from types import SimpleNamespace

    from dpsynth_core.engines.vllm_engine import vllm_sampling
    from dpsynth_core.models import load_tokenizer
    from serving.schemas import SequenceJob
    from serving.vllm_backend import VLLMBackend

    p = vllm_sampling(SamplingParams(max_new_tokens=7, temperature=0.5, top_p=0.9, n=2, stop=("x",), regex="a+"),
                      2**31 + 5)
    assert (p.n, p.temperature, p.top_p, p.max_tokens, p.stop, p.seed) == (2, 0.5, 0.9, 7, ["x"], 5)
    assert p.structured_outputs.regex == "a+"

    seen = []

    async def fake_generate(prompt, params, request_id, lora_request):
        seen.append(params)
        yield SimpleNamespace(outputs=[SimpleNamespace(text="abc STOP tail", token_ids=[1, 2, 3], finish_reason="length")])

    backend = VLLMBackend.__new__(VLLMBackend)  # no engine start: only the row -> request conversion
    backend.tokenizer, backend.max_prompt_tokens, backend.lora = load_tokenizer("tiny-llama"), 64, None
    backend.engine = SimpleNamespace(generate=fake_generate)
    job = SequenceJob("a b", max_new_tokens=5, temperature=0.7, top_p=0.8, seed=2**31 + 9, stop=["STOP", ""])
    out = asyncio.run(backend.generate_one(job))
    [params] = seen
    assert (params.n, params.max_tokens, params.temperature, params.top_p, params.seed, params.stop) == (
        1, 5, 0.7, 0.8, 9, ["STOP"])
    assert (out.text, out.completion_tokens, out.finish_reason) == ("abc ", 3, "stop")
