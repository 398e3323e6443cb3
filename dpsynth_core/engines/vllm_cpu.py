"""vLLM's CPU settings that depend on the host: the dtype and the cores the engine may use.

On a 2-core AVX2 host float32 beat emulated bfloat16 several times over, and reserving no core for
vLLM's front end helped again (measured: docs/results/config_figures.md). Without
native bf16 (AVX512-BF16 or AMX) vLLM's bf16 kernels are emulated, and on a 2-core host vLLM's default
leaves its model worker one core.
"""

from __future__ import annotations

import os
from functools import lru_cache

NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})
SMALL_HOST_CORES = 4  # at most this many cores: no core is reserved for vLLM's front end


@lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_dtype(requested: str, flags: frozenset[str] | None = None) -> str:
    """``auto``: bfloat16 where the CPU computes it natively, else float32; anything else as asked."""
    if requested != "auto":
        return requested
    return "bfloat16" if NATIVE_BF16_FLAGS & (cpu_flags() if flags is None else flags) else "float32"


def cpu_engine_env(kv_cache_gib: float, cores: int | None = None) -> dict[str, str]:
    """Environment of a CPU engine process: its KV-cache space, and on a small host every core for the
    model worker (a user's own ``VLLM_CPU_NUM_OF_RESERVED_CPU`` wins)."""
    env = {"VLLM_CPU_KVCACHE_SPACE": str(max(1, round(kv_cache_gib)))}
    cores = cores if cores is not None else len(os.sched_getaffinity(0))
    if cores <= SMALL_HOST_CORES:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
    return env
