"""WASP PLM weights: they sum to 1 and move towards the PLM whose samples the private records vote
for (constructed case, through the real Top-Q histogram and the calibrated Gaussian mechanism)."""

from __future__ import annotations

import numpy as np
import pytest

from dpsynth_core.privacy.gaussian_histogram import GaussianHistogram, calibrate_histogram_noise
from dpsynth_core.pe.histogram import TopQHistogram
from dpsynth_core.pe.weights import allocate_budget, update_plm_weights


def _constructed(rng: np.random.Generator, n_priv: int = 60, per_plm: int = 4, dim: int = 16):
    """3 classes with a centre each; private records sit near their centre. PLM 0 writes samples
    near the centres, PLM 1 writes samples of the right label far from them."""
    classes = ["a", "b", "c"]
    centres = rng.normal(size=(3, dim)) * 3
    priv_labels = [classes[i % 3] for i in range(n_priv)]
    priv = np.stack([centres[classes.index(y)] + 0.3 * rng.normal(size=dim) for y in priv_labels])
    synth, synth_labels, plm_ids = [], [], []
    for c, centre in enumerate(centres):
        for k, spread in ((0, 0.5), (1, 6.0)):
            for _ in range(per_plm):
                synth.append(centre + spread * rng.normal(size=dim))
                synth_labels.append(classes[c])
                plm_ids.append(k)
    return priv, priv_labels, np.stack(synth), synth_labels, plm_ids


def test_weights_move_towards_the_voted_plm_under_dp_noise():
    rng = np.random.default_rng(0)
    priv, priv_labels, synth, synth_labels, plm_ids = _constructed(rng)
    hist = TopQHistogram(q=4)
    raw = hist.compute(priv, priv_labels, synth, synth_labels)
    # without noise every nearest vote goes to PLM 0's samples
    assert raw.nearest[np.asarray(plm_ids) == 1].sum() == 0
    nm = calibrate_histogram_noise(4.0, 1e-3, histograms=2)
    mech = GaussianHistogram(nm, hist.sensitivity)
    w = np.array([0.5, 0.5])
    trajectory = [w]
    for t in range(2):
        noisy = mech.privatize(raw.joint(), np.random.default_rng([1, t]))[: len(synth)]
        w = update_plm_weights(noisy, plm_ids, 2, previous=w, momentum=0.3, floor=0.05)
        assert w.sum() == pytest.approx(1.0) and (w >= 0).all()
        trajectory.append(w)
    assert trajectory[1][0] > 0.5 and trajectory[2][0] > trajectory[1][0] - 1e-12
    assert trajectory[2][1] >= 0.05 / (1 + 0.05) - 1e-12  # the floor keeps PLM 1 alive


def test_weights_edge_cases():
    w = update_plm_weights(np.array([3.0, 1.0, 0.0, 0.0]), [0, 1, 2, 2], 3)
    assert w == pytest.approx([0.75, 0.25, 0.0])
    # all noisy votes negative: uniform, never NaN
    w = update_plm_weights(np.array([-1.0, -2.0]), [0, 1], 2)
    assert w == pytest.approx([0.5, 0.5])
    # floor: every PLM keeps a share, still sums to 1
    w = update_plm_weights(np.array([5.0, 0.0, 0.0]), [0, 0, 0], 3, floor=0.1)
    assert w.sum() == pytest.approx(1.0) and w.min() > 0 and w[0] > w[1]
    # budgets follow weights and always add up
    assert allocate_budget(np.array([0.7, 0.3]), 10) == [7, 3]
    assert sum(allocate_budget(np.array([1 / 3, 1 / 3, 1 / 3]), 10)) == 10


def test_paper_weights_normalise_by_each_plms_share_not_volume():
    """w_k = sum_{i in D_k} s_i / (|D_k| / |D|): PLM 0 wrote 10 samples voted 1.0 each, PLM 1 wrote 30
    samples voted 0.5 each. Summing raw votes (the old default) favours PLM 1 for its volume (15 > 10);
    the paper's rule favours PLM 0, whose samples are better (mean 1.0 > 0.5): 40 : 20."""
    votes = np.array([1.0] * 10 + [0.5] * 30)
    ids = [0] * 10 + [1] * 30
    assert update_plm_weights(votes, ids, 2) == pytest.approx([2 / 3, 1 / 3])
    assert update_plm_weights(votes, ids, 2, rule="raw_votes") == pytest.approx([0.4, 0.6])
    # noisy votes are summed unclipped: zero-mean noise on PLM 1's many useless samples adds nothing
    noise = np.random.default_rng(0).normal(0, 1.0, 4000)
    noise -= noise.mean()
    noisy = np.concatenate([np.full(1000, 0.2), noise])
    w = update_plm_weights(noisy, [0] * 1000 + [1] * 4000, 2)
    assert w[0] == pytest.approx(1.0)
    assert update_plm_weights(noisy, [0] * 1000 + [1] * 4000, 2, rule="raw_votes")[1] > 0.8  # clipped noise wins
    # a PLM with no samples left gets weight 0, not a division by zero
    assert update_plm_weights(np.array([1.0, 2.0]), [0, 0], 2) == pytest.approx([1.0, 0.0])


def test_extensions_are_off_by_default():
    from dpsynth_core.pe.config import PEConfig
    from dpsynth_core.pe.pipeline import resolve_delta

    cfg = PEConfig(method="wasp", data={"source": "biorxiv", "classes": ["x", "y"]})
    assert (cfg.weight_floor, cfg.weight_momentum, cfg.plm_weighting) == (0.0, 0.0, "share_normalised")
    # delta unset: the one default rule of every method, min(1e-5, M^-1.1) -- 1e-5 at this M
    assert cfg.delta is None and resolve_delta(cfg) == 1e-5 and cfg.example_fraction == 0.5 and cfg.contrastive
