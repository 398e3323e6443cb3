"""Randomness for DP mechanisms: OS entropy, never a config seed.

A DP guarantee assumes the adversary does not know the mechanism's random draws. A config seed
is public (it sits in ``config.yaml`` next to the released data), so noise drawn from it can be
subtracted and the private statistic recovered exactly. Every draw that a privacy argument relies
on -- noise, Poisson/Bernoulli sampling, exponential-mechanism selection, the number of tuning
trials -- comes from here. Config seeds remain for post-processing only (sampling text from a DP
model, shuffling synthetic rows).
"""

from __future__ import annotations

import secrets

import numpy as np


def secret_seed(bits: int = 128) -> int:
    """A fresh seed from the OS CSPRNG (``secrets``); never logged or written to a release."""
    return secrets.randbits(bits)


def secure_rng() -> np.random.Generator:
    """A numpy Generator seeded with 128 bits of OS entropy, independent of any config seed."""
    return np.random.default_rng(np.random.SeedSequence(secret_seed(128)))


def secure_torch_generator(device: str = "cpu"):
    """A ``torch.Generator`` seeded from OS entropy (63 bits: what ``manual_seed`` takes)."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(secret_seed(63))
    return gen


def bernoulli_subsample(n: int, expected: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """Indices of rows kept by independent Bernoulli(expected / n) inclusion, drawn with secret randomness.

    Used to take a private working set of about ``expected`` rows from a file of ``n``: unlike a
    seeded permutation (neighbouring files give unrelated subsets), Poisson subsampling never
    increases epsilon, so the guarantee stated for the subsample holds for the user's whole file.
    Returns all indices when ``expected >= n``.
    """
    if expected >= n:
        return np.arange(n)
    rng = rng if rng is not None else secure_rng()
    return np.flatnonzero(rng.random(n) < expected / n)
