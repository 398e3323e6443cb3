"""DP-SGD LoRA on a sharded model: torch FSDP2 (``fully_shard``) with opacus ghost clipping
(``ghost_fsdp``), for models that do not fit one device. Same privacy mechanics as ``engine.py``:

- every rank draws the same global Poisson batch and keeps its shard of units (``engine.py``);
- per-row gradient norms by ghost clipping (opacus ``GradSampleModuleFastGradientClippingFSDP``),
  then a second backward of the clip-weighted loss; FSDP reduce-scatters the gradients with a
  divide factor of 1, so each rank's gradient shard is the SUM over all ranks' clipped rows;
- each rank adds N(0, (sigma*C)^2) to its own shard only: shards are disjoint, so every coordinate
  gets noise exactly once per logical batch, as with one worker -- epsilon does not depend on the
  world size;
- every rank runs the same number of physical batches (FSDP all-gathers weights in each forward),
  padding with zero-weight batches, which add exactly zero.

Constraints from opacus' FSDP support: every trainable layer must have a ghost norm sampler (LoRA's
``nn.Linear`` has one) and no trainable parameter may be tied (embeddings and lm_head are frozen).
Needs an initialised ``torch.distributed`` process group (gloo on CPU, nccl on GPU).
"""

from __future__ import annotations

import torch
from torch import nn

from dpsynth_core.dpsgd.clipping import GhostClipper, PerSampleClipper, GradZeroer
from dpsynth_core.dpsgd.engine import DpSgdEngine, derived_seed
from dpsynth_core.dpsgd.sampling import physical_chunks


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


class FsdpGhostClipper(GhostClipper):
    """Shards ``model`` with opacus' ``FSDP2Wrapper`` and clips per row with ghost clipping. The
    buffers it fills are this rank's shards of the summed clipped gradient."""

    def __init__(self, model: nn.Module, max_grad_norm: float):
        from opacus.grad_sample.grad_sample_module_fast_gradient_clipping_fsdp import (
            GradSampleModuleFastGradientClippingFSDP,
        )
        from opacus.utils.fsdp_utils import FSDP2Wrapper
        from torch.distributed.fsdp import FSDPModule

        _untie_frozen_output_embeddings(model)
        sharded = FSDP2Wrapper(model)
        for module in sharded.modules():
            if isinstance(module, FSDPModule):
                module.set_gradient_divide_factor(1.0)  # a sum over ranks: clipped sums add up
                module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
        PerSampleClipper.__init__(self, sharded, max_grad_norm)  # params are the sharded (DTensor) ones now
        self._gsm = GradSampleModuleFastGradientClippingFSDP(
            sharded, batch_first=True, loss_reduction="sum", max_grad_norm=self.max_grad_norm, strict=False,
        )
        self._zero = GradZeroer(self.params)

    @staticmethod
    def _local_grad(grad: torch.Tensor) -> torch.Tensor:
        return _local(grad)  # this rank's shard of the reduce-scattered sum


class FsdpDpSgdEngine(DpSgdEngine):
    """``DpSgdEngine`` on an FSDP2-sharded model (``gpu_strategy: fsdp2``)."""

    def __init__(self, examples, config, **kwargs):
        if config.clipping != "ghost" or config.max_examples_per_user != 1:
            from dpsynth_core.errors import ConfigError

            raise ConfigError("gpu_strategy 'fsdp2' needs clipping: ghost and one example per unit (opacus ghost_fsdp)")
        if kwargs.get("dist") is None or kwargs["dist"].world_size != torch.distributed.get_world_size():
            raise ValueError("FsdpDpSgdEngine needs dist= matching the initialised process group")
        super().__init__(examples, config, clipper_factory=FsdpGhostClipper, **kwargs)
        # fully_shard swapped the parameters for sharded ones: train those
        self.params = list(self.clipper.params)
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate, weight_decay=config.weight_decay)
        self._names = [n for n, p in self.model.named_parameters() if p.requires_grad]

    def clipped_sum(self, groups):
        """This rank's shards of the sum (over ALL ranks' units) of clipped unit gradients."""
        buffers = [torch.zeros_like(_local(p), dtype=torch.float32) for p in self.params]
        chunks = physical_chunks(groups, self.config.physical_batch_size)
        n_chunks = torch.tensor([len(chunks)], dtype=torch.long)
        self.dist.all_reduce_max_(n_chunks)
        loss_sum, n_units = 0.0, 0
        for i in range(int(n_chunks)):
            if i < len(chunks):
                chunk = chunks[i]
                rows, weights = [self.tokenized[j] for g in chunk for j in g], torch.ones(len(chunk))
            else:  # keeps this rank in FSDP's collectives; weight 0 adds exactly nothing
                rows, weights = [self.tokenized[0]], torch.zeros(1)
            unit_losses, _ = self._forward_losses(rows, weights)
            self.clipper.accumulate(unit_losses, torch.arange(len(rows), device=self.device), len(rows), buffers)
            if i < len(chunks):
                loss_sum += float(unit_losses.detach().sum())
                n_units += len(rows)
        return buffers, loss_sum, n_units

    def noisy_gradients(self) -> tuple[list[torch.Tensor], float, int]:
        """This rank's shards of the step's noisy mean gradient (``privatize``)."""
        buffers, loss_sum, n_units = self.clipped_sum(self._unit_groups(self.step))
        return self.privatize(buffers, self.step), loss_sum, n_units

    def _as_grad(self, param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        return _as_like(param, grad.to(param.dtype))

    def privatize(self, buffers: list[torch.Tensor], step: int) -> list[torch.Tensor]:
        """This rank's shards of the noisy mean gradient: noise on its own shard only (disjoint
        shards: each coordinate noised once), divided by the expected global batch."""
        generator = torch.Generator(device=buffers[0].device)
        generator.manual_seed(derived_seed(self.sampler.seed, step, 0xD15E, self.dist.rank))  # one stream per shard
        out = []
        for buf in buffers:
            noisy = buf.clone()
            if self.noise_multiplier > 0:
                noisy += torch.normal(0.0, self.noise_multiplier * self.config.max_grad_norm, size=buf.shape,
                                      generator=generator, device=buf.device, dtype=buf.dtype)
            out.append(noisy / float(self.config.expected_batch_size))
        return out

    def gather(self, shards: list[torch.Tensor]) -> list[torch.Tensor]:
        """Full tensors from per-parameter shards (collective)."""
        return [_full(_as_like(p, s)) for p, s in zip(self.params, shards)]

    # -- state: full (unsharded) tensors, gathered collectively on every rank ----------------
    def adapter_state(self) -> dict[str, torch.Tensor]:
        return {n: _full(p.detach()).cpu().contiguous() for n, p in zip(self._names, self.params)}

    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for n, p in zip(self._names, self.params):
                _local(p).copy_(_shard_of(p, state[n].to(self.device, p.dtype)))

    def optimizer_state(self) -> dict:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        import copy

        # every rank gets the full state; a deep copy, as Adam's "step" tensors are the live ones
        return copy.deepcopy(get_optimizer_state_dict(self.model, self.optimizer,
                                                      options=StateDictOptions(full_state_dict=True)))

    def load_optimizer_state(self, state: dict) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(self.model, self.optimizer, state, options=StateDictOptions(full_state_dict=True))

    def save_adapter(self, path) -> None:
        """peft adapter directory from the gathered weights (collective: call on every rank)."""
        from peft import get_peft_model_state_dict

        full = self.adapter_state()
        if self.dist.rank == 0:
            peft_model = self.model
            state = get_peft_model_state_dict(peft_model, state_dict=full)
            peft_model.save_pretrained(str(path), state_dict=state)


def _untie_frozen_output_embeddings(model: nn.Module) -> None:
    """FSDP2 cannot put one tied weight in two groups: give the frozen lm_head its own copy (same
    values, so the same function; trainable tied weights are refused by opacus anyway)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    out, inp = base.get_output_embeddings(), base.get_input_embeddings()
    if out is not None and inp is not None and out.weight is inp.weight:
        if out.weight.requires_grad:
            raise ValueError("ghost_fsdp: the tied embedding / lm_head must be frozen")
        out.weight = nn.Parameter(out.weight.detach().clone(), requires_grad=False)
        base.config.tie_word_embeddings = False


def _as_like(param: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as a gradient of ``param``: a DTensor of the same mesh and placement if sharded."""
    if hasattr(param, "to_local"):
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape,
                                  stride=param.stride())
    return local


def _shard_of(param: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """This rank's piece of ``full`` under ``param``'s sharding."""
    if hasattr(param, "to_local"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full, param.device_mesh, param.placements).to_local()
    return full
