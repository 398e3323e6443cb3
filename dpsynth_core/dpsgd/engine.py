"""One DP-SGD LoRA worker: model building, the logical step, noise added once per logical batch.

A logical step on each of ``world_size`` ranks:
 1. every rank draws the same global Poisson batch and keeps its shard (possibly empty);
 2. physical batches: forward, per-row loss (target tokens only), per-unit clipping into a
    local sum of clipped gradients (``clipping.py``);
 3. rank 0 alone adds N(0, (sigma*C)^2) to its sum; one all-reduce (sum) over the flattened
    buffers gives every rank  sum_u clip(g_u) + noise  -- noise exactly once;
 4. divide by the expected GLOBAL logical batch, and step the plain optimizer. Every rank holds
    the same weights and the same gradient, so they stay in sync without a DDP wrapper (this is
    DPDDP, done by hand so empty shards still join the all-reduce).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from dpsynth_core.config.placement import Placement, placement_dtype, resolve_placement
from dpsynth_core.dpsgd.budget import sampling_rate as poisson_rate
from dpsynth_core.dpsgd.clipping import PerSampleClipper, make_clipper
from dpsynth_core.dpsgd.config import DpSgdConfig, TrainExample
from dpsynth_core.dpsgd.data import collate, per_example_loss, tokenize_examples
from dpsynth_core.dpsgd.lora_targets import check_target_modules
from dpsynth_core.dpsgd.sampling import PoissonSampler, PrivacyUnits, physical_chunks, select_examples
from dpsynth_core.errors import ConfigError

PenaltyFn = Callable[[torch.Tensor, dict], torch.Tensor]


@dataclass(frozen=True)
class DistContext:
    """Where this worker sits. world_size == 1 means no torch.distributed calls at all."""

    rank: int = 0
    world_size: int = 1

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.SUM)
        return tensor

    def all_reduce_max_(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            torch.distributed.all_reduce(tensor, op=torch.distributed.ReduceOp.MAX)
        return tensor


def resolve_device(config: DpSgdConfig, local_rank: int = 0) -> torch.device:
    return resolve_placement(config.device, config.dtype, local_rank=local_rank).torch_device()


def stage_placement(config: DpSgdConfig, device: torch.device) -> Placement:
    """The config's dtype on the engine's device (``auto``: bf16 on a GPU, fp32 on the CPU)."""
    dtype = placement_dtype(config.dtype) if config.dtype != "auto" else ("bf16" if device.type == "cuda" else "fp32")
    return Placement(device.type, dtype, device.index or 0)


def build_lora_model(config: DpSgdConfig, device: torch.device, base=None):
    """Base model + fresh LoRA adapter (same init on every rank), everything else frozen.

    ``base``: a ``(causal LM, tokenizer)`` pair to use instead of loading ``config.model`` (shape-only
    models built straight on the device, e.g. the GPU check's 7B). The base is on its device, in
    the placement's dtype, before the adapter is attached: an adapter wrapped first and moved later
    can leave hooks and optimizers holding stale parameters (opacus#820)."""
    from dpsynth_core.models import load_causal_lm

    placement = stage_placement(config, device)
    if base is None:
        model, tokenizer = load_causal_lm(config.model, placement=placement)
    else:
        model, tokenizer = base
        model.to(device=placement.torch_device(), dtype=placement.torch_dtype())
    return attach_lora(model, config, placement), tokenizer


def attach_lora(model: nn.Module, config: DpSgdConfig, placement: Placement) -> nn.Module:
    """A fresh peft LoRA adapter on ``model`` (already placed), trainable in fp32, all else frozen."""
    from peft import LoraConfig, get_peft_model

    from dpsynth_core.config.placement import place_model

    check_target_modules(model, config.lora, config.model)
    model.config.use_cache = False
    torch.manual_seed(config.seed)  # identical LoRA init on every rank
    peft_model = get_peft_model(
        model,
        LoraConfig(
            r=config.lora.r,
            lora_alpha=config.lora.alpha,
            lora_dropout=config.lora.dropout,
            target_modules=list(config.lora.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        ),
    )
    # Frozen embeddings and (tied) lm_head: ghost clipping rejects tied trainable parameters, and
    # the adapter should be the only thing the private data moves.
    for name, p in peft_model.named_parameters():
        if "lora_" not in name:
            p.requires_grad_(False)
    base = peft_model.get_base_model()
    assert not base.get_input_embeddings().weight.requires_grad
    if base.get_output_embeddings() is not None:
        assert not base.get_output_embeddings().weight.requires_grad
    place_model(peft_model, placement)  # master LoRA weights in fp32 even with a bf16 base
    peft_model.train()
    return peft_model


def derived_seed(*parts: int) -> int:
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1, dtype=np.uint64)[0] >> 1)


def privatize_and_reduce(
    flat_sum: torch.Tensor,
    *,
    noise_multiplier: float,
    max_grad_norm: float,
    expected_batch_size: int,
    dist: DistContext,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Sum of clipped gradients (this rank's share) -> noisy mean gradient, identical on all ranks.

    Noise N(0, (sigma*C)^2) is added on rank 0 only, before the all-reduce, so the logical batch
    gets it exactly once whatever the number of workers. The result is divided by the expected
    global batch size (the Poisson batch size is itself private, so it must not be used).
    """
    out = flat_sum.clone()
    if dist.rank == 0 and noise_multiplier > 0:
        out += torch.normal(
            0.0, noise_multiplier * max_grad_norm, size=out.shape, generator=generator, device=out.device, dtype=out.dtype
        )
    dist.all_reduce_(out)
    return out / float(expected_batch_size)


class DpSgdEngine:
    """Holds the model, optimizer and sampler of one worker and runs logical DP-SGD steps."""

    def __init__(
        self,
        examples: Sequence[TrainExample],
        config: DpSgdConfig,
        *,
        noise_multiplier: float,
        sampling_seed: int,
        dist: DistContext = DistContext(),
        device: torch.device | None = None,
        per_example_penalty: PenaltyFn | None = None,
        clipper_factory: Callable[[nn.Module, float], PerSampleClipper] | None = None,
        base: tuple[nn.Module, object] | None = None,
    ):
        """``clipper_factory(model, max_grad_norm)`` replaces the clipper that ``config.clipping``
        names (non-private references and baselines only). ``base``: a ``(model, tokenizer)`` pair
        instead of loading ``config.model`` (``build_lora_model``)."""
        if config.gpu_strategy == "fsdp2" and clipper_factory is None:
            raise ConfigError("field 'gpu_strategy': 'fsdp2' runs in dpsynth_core.dpsgd.fsdp.FsdpDpSgdEngine under a "
                              "process group (the Ray Train runner); use 'ddp' in process")
        self.config = config
        self.dist = dist
        self.device = device or resolve_device(config)
        self.noise_multiplier = float(noise_multiplier)
        self.penalty = per_example_penalty
        self.units = PrivacyUnits.from_user_ids([e.user_id for e in examples])
        self.sampler = PoissonSampler(len(self.units), config.expected_batch_size, sampling_seed,
                                      sampling_rate=poisson_rate(config, len(self.units)))
        self.max_per_unit = config.max_examples_per_user if self.units.user_level else 1
        if self.max_per_unit > 1 and config.clipping == "ghost":
            raise ConfigError("max_examples_per_user > 1 needs clipping='hooks'")
        self.model, self.tokenizer = build_lora_model(config, self.device, base=base)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.tokenized = tokenize_examples(examples, self.tokenizer, config.max_seq_len)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        factory = clipper_factory or (lambda model, c: make_clipper(config.clipping, model, c))
        self.clipper = factory(self.model, config.max_grad_norm)
        self.optimizer = torch.optim.AdamW(self.params, lr=config.learning_rate, weight_decay=config.weight_decay)
        self.step = 0  # logical steps completed

    # -- one logical step ---------------------------------------------------------------------
    def _unit_groups(self, step: int) -> list[list[int]]:
        units = self.sampler.local_units(step, self.dist.rank, self.dist.world_size)
        if self.max_per_unit == 1 and not self.units.user_level:
            return [self.units.members[int(u)] for u in units]
        # One RNG per (step, unit): the choice does not depend on which rank holds the unit.
        groups = []
        for u in units:
            rng = self.sampler.rng(step, stream=1 + int(u))
            groups.extend(select_examples(np.array([u]), self.units, self.max_per_unit, rng))
        return groups

    def _forward_losses(self, rows, weights: torch.Tensor) -> tuple[torch.Tensor, dict]:
        batch = {k: v.to(self.device) for k, v in collate(rows, self.pad_id).items()}
        out = self.clipper.module(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
        )
        losses = per_example_loss(out.logits, batch["labels"])
        if self.penalty is not None:
            extra = self.penalty(out.logits, batch)
            if extra.shape != losses.shape:
                raise ValueError(f"per_example_penalty returned shape {tuple(extra.shape)}, expected {tuple(losses.shape)}")
            losses = losses + extra.to(losses.dtype)
        return losses * weights.to(losses.device), batch

    def clipped_sum(self, groups: list[list[int]]) -> tuple[list[torch.Tensor], float, int]:
        """Sum over the given units of clipped per-unit gradients; also the summed unit loss."""
        buffers = [torch.zeros_like(p, dtype=torch.float32) for p in self.params]
        loss_sum, n_units = torch.zeros((), dtype=torch.float64, device=self.device), 0
        for chunk in physical_chunks(groups, self.config.physical_batch_size):
            rows = [self.tokenized[i] for g in chunk for i in g]
            row_unit = torch.tensor([j for j, g in enumerate(chunk) for _ in g], dtype=torch.long)
            weights = torch.tensor([1.0 / len(g) for g in chunk for _ in g])
            unit_losses, _ = self._forward_losses(rows, weights)
            self.clipper.accumulate(unit_losses, row_unit, len(chunk), buffers)  # row_unit stays on the host
            loss_sum += unit_losses.detach().sum()  # read once per step: no device sync per physical batch
            n_units += len(chunk)
        return buffers, float(loss_sum), n_units

    def noisy_gradients(self) -> tuple[list[torch.Tensor], float, int]:
        """The noisy mean gradient of logical step ``self.step``, one tensor per trainable
        parameter, identical on every rank; also this rank's summed unit loss and unit count.
        Calling it again for the same step gives the same draw (the sampler and the noise are keyed
        by (seed, step))."""
        step = self.step
        refresh = getattr(self.penalty, "refresh", None)
        if refresh is not None:  # constants from the current model's own generated rows (tabular.fair_eo)
            refresh(self.model, self.tokenizer, step)
        buffers, loss_sum, n_units = self.clipped_sum(self._unit_groups(step))
        flat = torch.cat([b.reshape(-1) for b in buffers])
        generator = None
        if self.dist.rank == 0:
            generator = torch.Generator(device=flat.device)
            generator.manual_seed(derived_seed(self.sampler.seed, step, 0xD15E))
        grad = privatize_and_reduce(
            flat,
            noise_multiplier=self.noise_multiplier,
            max_grad_norm=self.config.max_grad_norm,
            expected_batch_size=self.config.expected_batch_size,
            dist=self.dist,
            generator=generator,
        )
        return list(torch.split(grad, [p.numel() for p in self.params])), loss_sum, n_units

    def _as_grad(self, param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        return grad.view_as(param).to(param.dtype)

    def train_step(self) -> dict:
        """Run logical step ``self.step`` (0-based) on this rank; returns global loss stats."""
        grads, loss_sum, n_units = self.noisy_gradients()
        for p, g in zip(self.params, grads):
            p.grad = self._as_grad(p, g)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats = torch.tensor([loss_sum, float(n_units)], dtype=torch.float64, device=grads[0].device)
        self.dist.all_reduce_(stats)
        self.step += 1
        total_loss, total_units = float(stats[0]), int(stats[1])
        return {"step": self.step, "loss": total_loss / total_units if total_units else math.nan, "batch_units": total_units}

    # -- state --------------------------------------------------------------------------------
    def adapter_state(self) -> dict[str, torch.Tensor]:
        from peft import get_peft_model_state_dict

        return {k: v.detach().cpu().contiguous() for k, v in get_peft_model_state_dict(self.model).items()}

    def load_adapter_state(self, state: dict[str, torch.Tensor]) -> None:
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(self.model, {k: v.to(self.device) for k, v in state.items()})

    def save_adapter(self, path) -> None:
        """peft adapter directory (adapter_config.json + adapter_model.safetensors)."""
        self.model.save_pretrained(str(path))
