"""Training-curve PNG: loss and epsilon spent against the step."""

from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path


def save_training_curve(history: list[dict], path: Path, *, title: str = "DP-SGD LoRA") -> Path:
    """Two panels (loss, epsilon) written atomically to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    steps = [h["step"] for h in history]
    loss = [h.get("loss", math.nan) for h in history]
    eps_pts = [(h["step"], h["epsilon"]) for h in history if h.get("epsilon") is not None]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    ax1.plot(steps, loss, lw=1.2, color="tab:blue")
    ax1.set_xlabel("step")
    ax1.set_ylabel("train loss (target tokens)")
    ax1.set_title("loss")
    ax1.grid(alpha=0.3)
    if eps_pts:
        ax2.plot([s for s, _ in eps_pts], [e for _, e in eps_pts], lw=1.2, color="tab:red", marker=".")
    ax2.set_xlabel("step")
    ax2.set_ylabel("epsilon spent")
    ax2.set_title("privacy")
    ax2.grid(alpha=0.3)
    fig.suptitle(title)
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
