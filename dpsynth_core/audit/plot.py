"""The audit's PNG: canary scores of members vs non-members, and the bound vs number of guesses."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def save_audit_plot(result, path: Path) -> Path:
    """Two panels written atomically to ``path``; ``result`` is an ``AuditResult``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ax1.hist([result.scores_in, result.scores_out], bins=30, label=["included (in)", "held out (out)"],
             color=["tab:red", "tab:blue"], alpha=0.75, histtype="stepfilled")
    ax1.set_xlabel("canary score: loss before - loss after training")
    ax1.set_ylabel("canaries")
    ax1.set_title(f"m = {result.canaries} canaries")
    ax1.legend()
    ax1.grid(alpha=0.3)
    guesses = [row["guesses"] for row in result.curve]
    ax2.plot(guesses, [row["epsilon_lower_bound"] for row in result.curve], marker=".", color="tab:purple",
             label=f"lower bound ({result.confidence:.0%})")
    ax2.axhline(result.claimed_epsilon, color="tab:green", ls="--", label=f"claimed eps = {result.claimed_epsilon:g}")
    ax2.scatter([result.guesses], [result.epsilon_lower_bound], color="black", zorder=3,
                label=f"declared guesses: {result.correct}/{result.guesses} right")
    ax2.set_xlabel("guesses (half in, half out)")
    ax2.set_ylabel("epsilon lower bound")
    ax2.set_title("bound vs guesses (only the declared point is a valid bound)", fontsize=9)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    title = f"one-run audit of DP-SGD on {result.model}: eps >= {result.epsilon_lower_bound:.2f} vs claimed {result.claimed_epsilon:g}"
    if not result.private:
        title += "  [NOISE OFF: NOT PRIVATE]"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".png", dir=path.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=110)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)
    return path
