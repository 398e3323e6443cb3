"""Per-sample (per privacy unit) gradient clipping on top of opacus's per-sample machinery.

Two interchangeable clippers, each adding  sum_u clip_C(grad_u)  into a buffer per trainable
parameter:
- ``HooksClipper``: opacus ``GradSampleModule`` materialises per-row gradients; rows of one
  privacy unit (user) are summed before clipping.
- ``GhostClipper``: opacus ghost clipping (``GradSampleModuleFastGradientClipping``) computes
  per-row norms without per-row gradients, then a second backward weighted by the clip factors
  gives the sum of clipped gradients. One row per unit only.
Noise and the all-reduce live in ``engine.py``; this module never sees more than one worker.
"""

from __future__ import annotations

import warnings
from abc import ABC, abstractmethod

import torch
from torch import nn

_EPS = 1e-6  # same stabiliser as opacus
# Benign with frozen embeddings: no module input requires grad, the hooks still see grad_output.
warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients are computed")


class GradZeroer:
    """The bit of an optimizer that opacus's ghost backward calls between its two passes (ghost clipping
    here and in fsdp.py)."""

    def __init__(self, params: list[nn.Parameter]):
        self.params = params

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


class PerSampleClipper(ABC):
    """Wraps a model whose only trainable parameters are the ones to privatise (LoRA)."""

    def __init__(self, model: nn.Module, max_grad_norm: float):
        self.max_grad_norm = float(max_grad_norm)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if not self.params:
            raise ValueError("model has no trainable parameters")
        self.last_norms: torch.Tensor | None = None  # per-unit norms before clipping (diagnostics)

    @property
    @abstractmethod
    def module(self) -> nn.Module:
        """The wrapped module to call forward on."""

    @abstractmethod
    def accumulate(self, row_losses: torch.Tensor, row_unit: torch.Tensor, n_units: int, buffers: list[torch.Tensor]) -> None:
        """Add the sum over units of clipped unit gradients into ``buffers`` (one per param).

        ``row_losses[i]`` is row i's loss already weighted so that a unit's loss is the sum of its
        rows; ``row_unit[i]`` in [0, n_units) names the row's unit.
        """

    def clip_factors(self, norms: torch.Tensor) -> torch.Tensor:
        return (self.max_grad_norm / (norms + _EPS)).clamp(max=1.0)


class HooksClipper(PerSampleClipper):
    """Materialised per-sample gradients (opacus hooks)."""

    def __init__(self, model: nn.Module, max_grad_norm: float):
        from opacus import GradSampleModule

        super().__init__(model, max_grad_norm)
        self._gsm = GradSampleModule(model, batch_first=True, loss_reduction="sum", strict=False)

    @property
    def module(self) -> nn.Module:
        return self._gsm

    def accumulate(self, row_losses, row_unit, n_units, buffers):
        # One row per unit, in order: decided once, on the host (a device comparison per parameter
        # would stall the GPU's queue once per LoRA matrix).
        one_row_each = n_units == len(row_losses) and bool(
            (row_unit.cpu() == torch.arange(n_units)).all())
        row_losses.sum().backward()
        per_unit = []
        for p in self.params:
            gs = p.grad_sample  # [rows, *p.shape]
            if one_row_each:
                per_unit.append(gs)
            else:
                g = torch.zeros((n_units, *gs.shape[1:]), dtype=gs.dtype, device=gs.device)
                per_unit.append(g.index_add_(0, row_unit.to(gs.device), gs))
        norms = torch.stack([g.reshape(n_units, -1).norm(2, dim=1) for g in per_unit], dim=1).norm(2, dim=1)
        factors = self.clip_factors(norms)
        for buf, g in zip(buffers, per_unit):
            buf.add_(torch.einsum("i,i...->...", factors.to(g.dtype), g).to(buf.dtype))
        self.last_norms = norms.detach()
        for p in self.params:
            p.grad_sample = None
            p.grad = None


class GhostClipper(PerSampleClipper):
    """Opacus ghost clipping: norms without per-sample gradients, two backward passes."""

    def __init__(self, model: nn.Module, max_grad_norm: float):
        from opacus.grad_sample import GradSampleModuleFastGradientClipping

        super().__init__(model, max_grad_norm)
        self._gsm = GradSampleModuleFastGradientClipping(
            model,
            batch_first=True,
            loss_reduction="sum",
            max_grad_norm=self.max_grad_norm,
            use_ghost_clipping=True,
            strict=False,
        )
        self._zero = GradZeroer(self.params)

    @property
    def module(self) -> nn.Module:
        return self._gsm

    def accumulate(self, row_losses, row_unit, n_units, buffers):
        from opacus.utils.fast_gradient_clipping_utils import DPTensorFastGradientClipping

        if n_units != len(row_losses):
            raise ValueError("ghost clipping needs exactly one row per privacy unit")
        DPTensorFastGradientClipping(self._gsm, self._zero, row_losses, loss_reduction="sum").backward()
        self.last_norms = self._gsm.per_sample_gradient_norms.detach()
        for buf, p in zip(buffers, self.params):
            if p.grad is not None:
                buf.add_(self._local_grad(p.grad).to(buf.dtype))
            p.grad = None

    @staticmethod
    def _local_grad(grad: torch.Tensor) -> torch.Tensor:
        """This process's part of a gradient (all of it here; a shard under FSDP)."""
        return grad


def make_clipper(mode: str, model: nn.Module, max_grad_norm: float) -> PerSampleClipper:
    if mode == "hooks":
        return HooksClipper(model, max_grad_norm)
    if mode == "ghost":
        return GhostClipper(model, max_grad_norm)
    raise ValueError(f"unknown clipping mode '{mode}' (expected 'ghost' or 'hooks')")


class BatchGradientSum(PerSampleClipper):
    """No clipping: the batch gradient summed by one ordinary backward. Only for non-private runs
    (epsilon = inf references, the non-DP baseline of the benchmarks), never under a DP event."""

    def __init__(self, model, max_grad_norm: float):
        self._model = model
        super().__init__(model, max_grad_norm)

    @property
    def module(self):
        return self._model

    def accumulate(self, row_losses, row_unit, n_units, buffers):
        row_losses.sum().backward()
        for buf, p in zip(buffers, self.params):
            if p.grad is not None:
                buf.add_(p.grad.to(buf.dtype))
            p.grad = None

