"""Disjoint pools of the synthetic attribute rows: Best-of-N anchors, RL prompts, evaluation.

IFAcc after RL is only meaningful on rows the policy never trained on: the anchors are SFT targets
and the RL prompts are what the reward was maximised on, so both would flatter the policy. Rows of
features.csv are AIM samples in random order, so contiguous blocks are exchangeable draws.
"""

from __future__ import annotations

POOLS = ("anchor", "rl", "eval")


def pool_sizes(n_rows: int, anchor_share: float, rl_share: float) -> dict[str, int]:
    """Rows per pool; each pool gets at least one row when there are at least three rows."""
    if n_rows < 3:
        raise ValueError(f"three disjoint pools need at least 3 synthetic rows (features.n_synthetic = {n_rows})")
    anchor = min(max(1, round(n_rows * anchor_share)), n_rows - 2)
    rl = min(max(1, round(n_rows * rl_share)), n_rows - anchor - 1)
    return {"anchor": anchor, "rl": rl, "eval": n_rows - anchor - rl}


def pool_labels(n_rows: int, anchor_share: float, rl_share: float) -> list[str]:
    """The pool of each row index: anchors first, then RL prompts, then evaluation rows."""
    sizes = pool_sizes(n_rows, anchor_share, rl_share)
    return [name for name in POOLS for _ in range(sizes[name])]
