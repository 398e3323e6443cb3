"""vLLM's host-dependent CPU settings (dpsynth_core.engines.vllm_cpu): bf16 only where the CPU computes it
natively, every core for the model worker on a small host. Pure functions: no vllm needed."""

from __future__ import annotations

from dpsynth_core.engines.vllm_cpu import cpu_dtype, cpu_engine_env, cpu_flags
from serving.vllm_backend import engine_settings


def test_auto_dtype_is_bf16_only_with_native_bf16() -> None:
    assert cpu_dtype("auto", frozenset({"avx2", "fma", "f16c"})) == "float32"  # this project's AMD EPYC
    assert cpu_dtype("auto", frozenset({"avx512f", "avx512_bf16"})) == "bfloat16"
    assert cpu_dtype("auto", frozenset({"amx_bf16", "amx_tile"})) == "bfloat16"
    assert cpu_dtype("auto", frozenset({"avx512f", "avx512_vnni"})) == "float32"  # AVX-512 without bf16
    assert cpu_dtype("bfloat16", frozenset()) == "bfloat16" and cpu_dtype("float32", frozenset({"amx_bf16"})) == "float32"
    assert cpu_dtype("auto") == ("bfloat16" if {"avx512_bf16", "amx_bf16"} & cpu_flags() else "float32")


def test_small_hosts_reserve_no_core_and_the_user_setting_wins(monkeypatch) -> None:
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    assert cpu_engine_env(4.4, cores=2) == {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert cpu_engine_env(0.2, cores=16) == {"VLLM_CPU_KVCACHE_SPACE": "1"}  # vLLM's own default on big hosts
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "1")
    assert cpu_engine_env(2, cores=2)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"


def test_engine_settings_use_the_host_rule_on_cpu_and_bf16_on_gpu() -> None:
    cpu, env = engine_settings(dtype="auto", kv_cache_gib=2, on_gpu=False)
    assert cpu["dtype"] == cpu_dtype("auto") and cpu["enforce_eager"] is True and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    gpu, gpu_env = engine_settings(dtype="auto", kv_cache_gib=2, on_gpu=True)
    assert gpu["dtype"] == "bfloat16" and "enforce_eager" not in gpu and gpu_env == {}
    assert engine_settings(dtype="float32", kv_cache_gib=2, on_gpu=False)[0]["dtype"] == "float32"
