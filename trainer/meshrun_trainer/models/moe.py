"""A mixture-of-experts MLP: top-k router, routed SwiGLU experts computed grouped, shared
experts, the load-balancing loss and DeepSeek-V3's bias balancing.

Routing (per token, in fp32): scores are the softmax of the router's logits over the experts
(Mixtral, Qwen-MoE) or a sigmoid each (DeepSeek-V3); the top ``experts_per_token`` experts are
chosen by the scores plus the balancing bias (the bias steers the choice only), and their
scores, renormalized to sum to 1 where the shape says so (always for sigmoid), weigh the
experts' outputs. No token is dropped: every expert computes every token routed to it (no
capacity factor), so a layout changes nothing but the order of sums.

The experts' weights are stacked, (experts, out, in) per SwiGLU matrix, so the routed tokens,
sorted by expert, go through one batched matrix multiplication per matrix: ``torch._grouped_mm``
on CUDA in bf16 (Hopper and later), elsewhere ``bmm`` over the groups padded to the largest.
Under expert parallelism (:mod:`meshrun_trainer.distributed.experts`) each rank holds
experts / ep of them (a DTensor sharded on the expert dimension), and the tokens travel to the
rank holding their expert and back with two ``all_to_all_single`` calls with split sizes.

Auxiliary loss (Switch Transformer, Fedus et al. 2022, eq. 4): ``E * sum_i f_i * P_i`` with
``f_i`` the share of the token choices that went to expert i and ``P_i`` the mean score of
expert i, taken over each sequence (DeepSeek-V3's sequence-wise form, so it is the same under
every data-parallel, pipeline and accumulation split), averaged over the sequences and weighed
by ``aux_loss_coefficient``. It joins the gradient through :class:`_AuxLoss` (Megatron-Core's
auxiliary-loss scaler): the reported training loss stays the cross-entropy. Under tensor and
context parallelism a rank routes a shard of each sequence: the shards' sums (choices and
scores per sequence) are added up over the cp x tp ranks holding them first (a differentiable
all-reduce), so the loss is the whole sequences' one, as one process computes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed._functional_collectives import all_to_all_single_autograd, wait_tensor
from torch.distributed.nn.functional import all_reduce as differentiable_all_reduce
from torch.distributed.tensor import DTensor

from meshrun.api.moe import BIAS_UPDATE_RATE
from meshrun.api.presets import ModelShape

AUX_SCALE = [1.0]
"""Forward passes per optimizer step on one replica, by which each micro-batch's auxiliary loss
is divided like its cross-entropy (set by the training loop)."""


COUNTING = [True]
"""False while a pass does not train (a pipeline's shape inference): no loads, no aux loss."""


def set_aux_passes(passes: int) -> None:
    AUX_SCALE[0] = 1.0 / passes


@contextmanager
def not_counted() -> Iterator[None]:
    """Passes inside count neither the experts' loads nor the auxiliary loss."""
    COUNTING[0] = False
    try:
        yield
    finally:
        COUNTING[0] = True


class _AuxLoss(torch.autograd.Function):
    """Identity on ``out``; in backward the auxiliary loss gets the gradient it would get had it
    been added to the training loss, and is counted in the layer's ``aux_sum`` (backward runs
    once per pass that trains, unlike forward: a pipeline's shape inference, a recomputation)."""

    @staticmethod
    def forward(ctx: Any, out: torch.Tensor, aux: torch.Tensor, layer: MoE) -> torch.Tensor:
        ctx.save_for_backward(aux)
        ctx.layer = layer
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        (aux,) = ctx.saved_tensors
        layer = ctx.layer
        if COUNTING[0]:
            share = AUX_SCALE[0] / layer.sequence_shards
            layer.aux_sum += float(aux) / layer.moe.aux_loss_coefficient * share
        # Every rank holding a shard of the sequences has the same loss. The differentiable
        # all-reduce's backward adds their gradients up: the tensor-parallel ranks' gradients
        # are summed (each injects 1/tp of it), the context-parallel ones' averaged with the
        # data-parallel ones (their cross-entropy is scaled by cp likewise).
        return grad, torch.full_like(aux, AUX_SCALE[0] / layer.summed_shards), None


def _local(weight: torch.Tensor) -> torch.Tensor:
    return weight.to_local() if isinstance(weight, DTensor) else weight


def grouped_kernel(device: torch.device) -> bool:
    """Whether ``torch._grouped_mm`` runs on ``device`` (CUDA compute capability 9.0 on)."""
    return hasattr(torch, "_grouped_mm") and torch.cuda.get_device_capability(device) >= (9, 0)


def grouped_matmul(x: torch.Tensor, weight: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` sorted by group, group g (``counts[g]`` rows) times ``weight[g]``^T:
    ``torch._grouped_mm`` on Hopper or later in bf16 (its kernel's domain), else ``bmm`` over
    the groups padded to the largest."""
    if x.is_cuda and x.dtype == torch.bfloat16 and grouped_kernel(x.device):
        offsets = torch.cumsum(counts, 0, dtype=torch.int32)
        return torch._grouped_mm(x, weight.transpose(-2, -1), offs=offsets)
    groups = weight.shape[0]
    size = int(counts.max().item()) if counts.numel() else 0
    starts = torch.cumsum(counts, 0) - counts
    group = torch.repeat_interleave(torch.arange(groups, device=x.device), counts)
    position = torch.arange(x.shape[0], device=x.device) - starts[group]
    padded = x.new_zeros(groups, size, x.shape[-1])
    padded[group, position] = x
    return torch.bmm(padded, weight.transpose(1, 2))[group, position]


class Experts(nn.Module):
    """The routed experts of one MoE layer, stacked: w1 (gate) and w3 (up) (E, f, h), w2 (down)
    (E, h, f); under expert parallelism each rank holds a contiguous E / ep of them."""

    def __init__(self, experts: int, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(experts, ffn, hidden))
        self.w2 = nn.Parameter(torch.empty(experts, hidden, ffn))
        self.w3 = nn.Parameter(torch.empty(experts, ffn, hidden))
        self.ep_group: dist.ProcessGroup | None = None
        """The ranks among which the experts are spread (None: all here)."""
        self.edp_group: dist.ProcessGroup | None = None
        """The ranks holding the same experts, whose gradients are summed (None: none)."""

    def compute(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows sorted by local expert, ``counts`` per local expert, through their SwiGLUs."""
        w1, w2, w3 = (_local(w).to(x.dtype) for w in (self.w1, self.w2, self.w3))
        hidden = F.silu(grouped_matmul(x, w1, counts)) * grouped_matmul(x, w3, counts)
        return grouped_matmul(hidden, w2, counts)

    def forward(self, x: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        """Rows sorted by global expert, ``counts`` per global expert: their outputs, in order;
        the rows of other ranks' experts make the round trip by all-to-all."""
        group = self.ep_group
        if group is None:
            return self.compute(x, counts)
        ep = dist.get_world_size(group)
        per_rank = counts.view(ep, -1)
        received = torch.empty_like(per_rank)
        dist.all_to_all_single(received, per_rank, group=group)
        send = per_rank.sum(1).tolist()
        recv = received.sum(1).tolist()
        arrived = wait_tensor(all_to_all_single_autograd(x, recv, send, group))  # type: ignore[no-untyped-call]
        # Arrived rows are ordered by (source rank, local expert); sort them by local expert.
        local = torch.arange(per_rank.shape[1], device=x.device).repeat(ep)
        order = torch.argsort(torch.repeat_interleave(local, received.flatten()), stable=True)
        out = self.compute(arrived[order], received.sum(0))
        back = torch.empty_like(out).index_copy(0, order, out)
        result: torch.Tensor = wait_tensor(  # type: ignore[no-untyped-call]
            all_to_all_single_autograd(back, send, recv, group)
        )
        return result


class SwiGLU(nn.Module):
    """A dense SwiGLU MLP (the shared experts)."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return result


class MoE(nn.Module):
    """A MoE layer's MLP: router, routed experts, shared experts (and their gate)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        moe = shape.moe
        assert moe is not None
        self.moe = moe
        self.router = nn.Linear(shape.hidden, moe.experts, bias=False)
        self.experts = Experts(moe.experts, shape.hidden, moe.expert_ffn_hidden)
        self.shared = SwiGLU(shape.hidden, moe.shared_width) if moe.shared_width else None
        self.shared_gate = (
            nn.Linear(shape.hidden, 1, bias=False) if moe.shared_expert_gate else None
        )
        self.register_buffer("expert_bias", torch.zeros(moe.experts))
        self.register_buffer("expert_load", torch.zeros(moe.experts), persistent=False)
        self.sequence_group: dist.ProcessGroup | None = None
        """Under tensor or context parallelism: the ranks holding the other shards of this
        rank's sequences (cp x tp)."""
        self.sequence_shards = 1
        """The size of ``sequence_group`` (cp x tp)."""
        self.summed_shards = 1
        """Of those, how many add their gradients up rather than average them (tp: the
        context-parallel ranks' gradients are averaged, as data parallelism's)."""
        self.stage_group: dist.ProcessGroup | None = None
        """The ranks of the pipeline stage that see the rest of the batch (loads summed)."""
        self.aux_sum = 0.0
        """The auxiliary losses (before the coefficient) of this step's passes, each divided by
        the passes: this replica's mean for the step (each rank of ``sequence_group`` holds
        1/(cp x tp) of it); whoever reads it resets it."""

    def reset_buffers(self) -> None:
        with torch.no_grad():
            self.get_buffer("expert_bias").zero_()
            self.get_buffer("expert_load").zero_()

    def route(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(the chosen experts (T, k), their weights (T, k), all scores (T, E)) in fp32."""
        moe = self.moe
        logits = F.linear(tokens.float(), self.router.weight.float())
        sigmoid = moe.router == "sigmoid"
        scores = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
        biased = scores + self.get_buffer("expert_bias") if moe.bias_balancing else scores
        chosen = torch.topk(biased, moe.experts_per_token, dim=-1).indices
        weights = scores.gather(1, chosen)
        if moe.normalize_top_k or sigmoid:
            weights = weights / weights.sum(-1, keepdim=True)
        return chosen, weights, scores

    def aux_loss(self, chosen: torch.Tensor, scores: torch.Tensor, batch: int) -> torch.Tensor:
        """Switch's balancing loss per sequence, averaged over the ``batch`` sequences (under
        tensor and context parallelism the sequences' shards' sums are added up first)."""
        experts, k = self.moe.experts, self.moe.experts_per_token
        picked = F.one_hot(chosen, experts).sum(1).float().view(batch, -1, experts).sum(1)
        if self.moe.router == "sigmoid":
            scores = scores / scores.sum(-1, keepdim=True)
        summed = scores.view(batch, -1, experts).sum(1)
        tokens = float(scores.shape[0] // batch)
        if self.sequence_group is not None:
            dist.all_reduce(picked, group=self.sequence_group)
            summed = differentiable_all_reduce(summed, group=self.sequence_group)  # type: ignore[no-untyped-call]
            tokens *= self.sequence_shards
        share = picked / (tokens * k)  # f_i per sequence
        probability = summed / tokens  # P_i per sequence
        return experts * (share * probability).sum(-1).mean()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, _, hidden = x.shape
        tokens = x.reshape(-1, hidden)
        chosen, weights, scores = self.route(tokens)
        flat = chosen.reshape(-1)
        counts = torch.bincount(flat, minlength=self.moe.experts)
        if COUNTING[0]:
            with torch.no_grad():
                self.get_buffer("expert_load").add_(counts.float())
        order = torch.argsort(flat, stable=True)
        routed = self.experts(tokens[order // self.moe.experts_per_token], counts)
        per_choice = torch.empty_like(routed).index_copy(0, order, routed)
        k = self.moe.experts_per_token
        out = (per_choice.view(-1, k, hidden) * weights.unsqueeze(-1).to(x.dtype)).sum(1)
        if self.shared is not None:
            shared = self.shared(tokens)
            if self.shared_gate is not None:
                shared = torch.sigmoid(self.shared_gate(tokens)) * shared
            out = out + shared
        coefficient = self.moe.aux_loss_coefficient
        if coefficient > 0 and torch.is_grad_enabled():
            aux = self.aux_loss(chosen, scores, batch) * coefficient
            out = _AuxLoss.apply(out, aux, self)  # type: ignore[no-untyped-call]
        return out.view(x.shape)

    def update_bias(self, group: dist.ProcessGroup | None) -> None:
        """Bias balancing after an optimizer step: each expert's bias moves by the update rate
        against the sign of its load error over the whole batch (summed over ``group``)."""
        load = self.get_buffer("expert_load")
        if self.moe.bias_balancing:
            if group is not None:
                dist.all_reduce(load, group=group)
            with torch.no_grad():
                error = load.mean() - load
                self.get_buffer("expert_bias").add_(torch.sign(error) * BIAS_UPDATE_RATE)
        load.zero_()


def moe_layers(module: nn.Module) -> list[MoE]:
    return [m for m in module.modules() if isinstance(m, MoE)]
