"""ACTG's owner-side plots: mean IFAcc per stage and the Anchored RL curve (matplotlib Agg, each
written atomically). Read by evaluation only; nothing here is released."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path


def plot_ifacc_stages(values: dict[str, float], path) -> object:
    """Bar chart of mean IFAcc per stage (plain sampling, Best-of-N, after RL)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(values)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    bars = ax.bar(names, [values[n] for n in names], color=["tab:gray", "tab:blue", "tab:green"][: len(names)])
    for b, n in zip(bars, names):
        ax.text(b.get_x() + b.get_width() / 2, b.get_height(), f"{values[n]:.3f}", ha="center", va="bottom")
    ax.set_ylim(0, 1)
    ax.set_ylabel("mean IFAcc")
    ax.set_title("Instruction-following accuracy")
    return save_figure(fig, Path(path))


def plot_rl_history(history: Sequence[dict], path: Path) -> Path:
    """Reward, SFT loss and gamma per RL step (matplotlib Agg, written atomically)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [h["reward"] for h in history], marker="o", label="reward (IFAcc)")
    ax.plot(steps, [h["sft_loss"] for h in history], marker="s", label="anchor SFT loss")
    ax.set_xlabel("RL step")
    ax2 = ax.twinx()
    ax2.plot(steps, [h["gamma"] for h in history], color="tab:gray", linestyle="--", label="gamma(t)")
    ax2.set_ylabel("gamma")
    lines = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(lines, [l.get_label() for l in lines], loc="best", fontsize=8)
    ax.set_title("Anchored RL (RLOO + gamma(t) * SFT)")
    return save_figure(fig, Path(path))


def save_figure(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp{os.getpid()}{path.suffix}")
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return path
