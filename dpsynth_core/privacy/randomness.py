"""Randomness for DP mechanisms: OS entropy, never a config seed.

A DP guarantee assumes the adversary does not know the mechanism's random draws. A config seed
is public (it sits in ``config.yaml`` next to the released data), so noise drawn from it can be
subtracted and the private statistic recovered exactly. Every draw that a privacy argument relies
on -- noise, Poisson/Bernoulli sampling, exponential-mechanism selection, the number of tuning
trials -- comes from here. Config seeds remain for post-processing only (sampling text from a DP
model, shuffling synthetic rows).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
from collections.abc import Sequence

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


def bernoulli_subsample(n: int, rate: float, rng: np.random.Generator | None = None) -> np.ndarray:
    """Indices of the rows kept by independent Bernoulli(``rate``) inclusion, from secret randomness."""
    if not 0 < rate <= 1:
        raise ValueError(f"inclusion rate must be in (0, 1], got {rate}")
    if rate == 1:
        return np.arange(n)
    rng = rng if rng is not None else secure_rng()
    return np.flatnonzero(rng.random(n) < rate)


def working_set(n: int, m: int, fraction: float | None, *, public_corpus: bool, field: str,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """Indices of the private working set drawn from a pool of ``n`` rows for the declared public size m.

    The inclusion rate must not depend on the private file: one more record would change every
    row's chance, and the ledger's epsilon would not hold for the file (docs/privacy.md has the
    measured extra epsilon). So it is

    * ``fraction`` (``data.sample_fraction``), a public rate, when the config gives one: a fixed
      rate never increases the cost (the proof is in docs/privacy.md);
    * every row when the pool has at most m rows;
    * m / n for a bundled public corpus (bioRxiv, Adult), whose size is a published constant;
    * otherwise refused (DataError naming ``field``, never a count): a file larger than m needs a
      public ``sample_fraction``.
    """
    if fraction is not None:
        return bernoulli_subsample(n, fraction, rng)
    if m >= n:
        return np.arange(n)
    if public_corpus:
        return bernoulli_subsample(n, m / n, rng)
    from dpsynth_core.errors import DataError

    raise DataError(f"{field}: the file has more rows than this working-set size; a rate of {field} / rows "
                    "would depend on the file's size (docs/privacy.md). Set data.sample_fraction, the public "
                    f"share of rows to draw (about {field} / rows), or raise {field} to use every row")


# ---------------------------------------------------------------------------------------------
# Test-only knobs that pin DP randomness
# ---------------------------------------------------------------------------------------------
TEST_MODE_ENV = "DPSYNTH_TEST_MODE"


def test_mode_enabled() -> bool:
    """True when ``DPSYNTH_TEST_MODE=1``: only then may a test pin DP randomness with a seed."""
    return os.environ.get(TEST_MODE_ENV, "") == "1"


def refuse_pinned_dp_seed(field: str, value: object) -> None:
    """Refuse a config value that would make DP noise reproducible, unless in test mode.

    A pinned noise seed sits in ``config.yaml`` next to the released outputs, so anyone can redraw
    the noise and subtract it. Tests may still pin it (``DPSYNTH_TEST_MODE=1``); the run's ledger
    is then marked "not private" by the caller.
    """
    if value is not None and not test_mode_enabled():
        raise ValueError(
            f"'{field}' pins the DP noise to a public seed, so the stated epsilon would not hold; "
            f"it is a test-only knob (set {TEST_MODE_ENV}=1 in tests) -- leave it unset for OS entropy"
        )


DPSGD_TEST_ONLY_KNOBS = ("sampling_seed", "stop_after_steps")  # a pinned DP seed; a simulated crash


def refuse_test_only_knobs(section: str, values: dict) -> None:
    """Refuse DP-SGD's test-only knobs in a user config (``section``: where they sit, e.g.
    ``generator``) unless ``DPSYNTH_TEST_MODE=1``; a run that uses one is marked not private."""
    used = [k for k in DPSGD_TEST_ONLY_KNOBS if values.get(k) is not None]
    if used and not test_mode_enabled():
        raise ValueError(
            f"{', '.join(f'{section}.{k}' for k in used)}: test-only (a pinned sampling/noise seed or a "
            f"simulated crash: the stated epsilon would not hold); refused unless {TEST_MODE_ENV}=1"
        )


# ---------------------------------------------------------------------------------------------
# Numpy's global RNG for post-processing only
# ---------------------------------------------------------------------------------------------
@contextlib.contextmanager
def seeded_global_numpy(seed: int | None):
    """Seed numpy's global RNG for a post-processing step (sampling rows from a DP model) and
    restore the previous state afterwards, so the config seed reaches nothing else.

    Not thread-safe (numpy's global RNG is process-wide): call from one thread at a time. With
    ``seed=None`` the global RNG is left alone.
    """
    if seed is None:
        yield
        return
    saved = np.random.get_state()
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        np.random.set_state(saved)


# ---------------------------------------------------------------------------------------------
# Owner-side held-out split that keeps neighbouring files neighbouring
# ---------------------------------------------------------------------------------------------
def content_rank_keys(contents: Sequence[str], seed: int) -> np.ndarray:
    """A public, reproducible pseudo-random key per row, computed from that row's content only.

    The held-out evaluation rows are those with the smallest keys. Because a row's key does not
    depend on any other row, adding or removing one record moves at most one other row between
    the held-out set and the rest: the private pools of neighbouring files stay neighbours, which a
    seeded permutation of the whole file does not guarantee.
    """
    key = int(seed).to_bytes(16, "little", signed=True)
    return np.array(
        [int.from_bytes(hashlib.blake2b(str(c).encode("utf-8"), digest_size=8, key=key).digest(), "little")
         for c in contents],
        dtype=np.uint64,
    )


def content_keyed_holdout(contents: Sequence[str], count: int, seed: int) -> np.ndarray:
    """Indices (sorted) of the ``count`` rows with the smallest content keys (see ``content_rank_keys``)."""
    if count <= 0:
        return np.array([], dtype=int)
    keys = content_rank_keys(contents, seed)
    return np.sort(np.argsort(keys, kind="stable")[:count])
