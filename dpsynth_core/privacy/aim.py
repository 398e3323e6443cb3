"""AIM (smartnoise-synth 1.0.8) with its private selection drawn from OS entropy.

Where AIM's randomness comes from in ``fit`` (read from ``snsynth/aim/aim.py`` and ``mbi``):

* measurement noise: ``snsynth.utils.gaussian_noise`` -> OpenDP's ``make_gaussian``, which draws
  from OpenDP's own CSPRNG (OS entropy); numpy's global seed does not reach it;
* selection (the exponential mechanism, 10 % of rho): ``snsynth.utils.exponential_mechanism``
  draws ``np.random.choice`` from numpy's GLOBAL RNG, which a config seed would pin;
* ``get_workload`` with ``num_marginals`` picks marginals with the global RNG: data-independent;
* ``mirror_descent`` (model estimation) draws nothing.

``sample`` (post-processing of the fitted model) draws rows from numpy's global RNG.

:class:`SecretSelectionAIM` overrides ``_worst_approximated`` with the same quality scores and the
same exponential mechanism, sampled from a fresh OS-entropy generator per fit. This does not touch
numpy's global state, so it is safe next to other threads. The selected cliques are kept in
``selections`` (they are part of the DP output: each is a noisy choice). Use
:func:`sample_rows` to seed sampling only (global state saved and restored).
"""

from __future__ import annotations

import contextlib
import io

import numpy as np

from dpsynth_core.privacy.randomness import secure_rng, seeded_global_numpy


def exponential_mechanism(qualities: dict, epsilon: float, sensitivity: float, rng: np.random.Generator):
    """smartnoise's ``exponential_mechanism`` (softmax of 0.5 * eps / sensitivity * q), drawn from ``rng``."""
    from scipy.special import softmax

    keys = list(qualities)
    q = np.array([qualities[k] for k in keys], dtype=float)
    p = softmax(0.5 * epsilon / sensitivity * (q - q.max()))
    return keys[int(rng.choice(p.size, p=p))]


def _aim_base():
    from snsynth.aim import AIMSynthesizer

    return AIMSynthesizer


def make_aim(epsilon: float, delta: float, rho: float | None = None, **aim_kwargs):
    """An AIM synthesizer whose selection uses secret randomness. ``rho``: spend exactly this rho
    (the value recorded in the ledger) instead of AIM's own conversion of (epsilon, delta)."""

    class SecretSelectionAIM(_aim_base()):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.selections: list = []
            self._selection_rng = secure_rng()

        def AIM(self, data, workload):  # noqa: N802 (smartnoise's name)
            if rho is not None:
                self.rho = rho
            self._selection_rng = secure_rng()  # fresh per fit; never from a config seed
            self.selections = []
            with contextlib.redirect_stdout(io.StringIO()):  # smartnoise prints "Initial Sigma" per fit
                return super().AIM(data, workload)

        def _worst_approximated(self, candidates, answers, model, eps, sigma):
            # Same scores as smartnoise-synth 1.0.8; only the random draw differs.
            errors, sensitivity = {}, {}
            for cl, wgt in candidates.items():
                bias = np.sqrt(2 / np.pi) * sigma * model.domain.size(cl)
                xest = model.project(cl).datavector()
                errors[cl] = wgt * (np.linalg.norm(answers[cl] - xest, 1) - bias)
                sensitivity[cl] = abs(wgt)
            chosen = exponential_mechanism(errors, eps, max(sensitivity.values()), self._selection_rng)
            self.selections.append(chosen)
            return chosen

    return SecretSelectionAIM(epsilon=epsilon, delta=delta, **aim_kwargs)


def sample_rows(aim, n_rows: int, seed: int | None):
    """Sample from a fitted AIM (post-processing): numpy's global RNG seeded by ``seed`` for the
    call only, then restored. Not thread-safe (numpy's global state)."""
    with seeded_global_numpy(seed):
        return aim.sample(n_rows)
