"""Context parallelism: every sequence split over the cp ranks, attention exact over all of it.

The split (load-balanced for causal attention, as Megatron-LM and torchtitan do): the sequence
is cut into 2 x cp equal chunks and rank i holds chunks i and 2cp - 1 - i, one early and one
late, so every rank's queries see the same number of keys. Tokens and targets are split alike
(:func:`sequence_share`), and each token keeps its global position (:func:`positions`), which
the rotary embedding uses.

Attention (Llama 3's way, Dubey et al. 2024, section 3.3.2): each rank all-gathers the keys and
values of the whole sequence over the cp group, as they are (the KV heads of grouped-query
attention, before they are repeated; under tensor parallelism the rank's own head shard), puts
them in sequence order, and computes each of its two query chunks against the keys up to the
chunk's end with a causal mask aligned to the bottom right (torch's ``causal_lower_right``: the
chunk's last query sees every key, its first sees the keys before it). The gather is torch's
autograd-aware functional all-gather, whose backward reduce-scatters (sums) the keys' and
values' gradients back to the ranks that computed them. On CUDA no mask is materialized: SDPA's
flash and memory-efficient kernels apply the lower-right causal bias themselves; elsewhere each
chunk's mask is chunk x prefix values (0 or -inf), made once per model and kept once for every
layer's backward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed._functional_collectives import all_gather_single_autograd
from torch.nn.attention.bias import causal_lower_right


@dataclass(frozen=True)
class ContextGroup:
    """This rank's place in its context-parallel group."""

    group: dist.ProcessGroup
    """The cp ranks sharing this rank's sequences."""
    rank: int
    """Position in the group: the rank holds chunks ``rank`` and ``2 * size - 1 - rank``."""
    size: int
    """The context-parallel degree."""
    seq_len: int
    """The whole sequence's tokens (the model's seqLen)."""
    device: torch.device
    """Where the rank computes: CUDA takes torch's lower-right causal bias, which its SDPA
    kernels apply without a mask in memory; elsewhere the mask is SDPA's additive one."""
    masks: tuple[torch.Tensor, ...] = field(init=False, repr=False)
    """The causal masks of the rank's two chunks (torch's bias on CUDA, else booleans), made
    once here: a tensor subclass cannot be created inside activation checkpointing's
    recomputation (a dispatch mode), and nothing is made again per layer."""
    additive: dict[tuple[Any, ...], torch.Tensor] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    """The boolean masks as SDPA's additive ones (0 or -inf) in the compute dtype, made once:
    given booleans, SDPA on the CPU makes that copy itself in every layer and keeps it for
    backward; given this one, every layer keeps the same."""

    def __post_init__(self) -> None:
        bias = self.device.type == "cuda"
        masks = self._masks(self.seq_len // (2 * self.size), None if bias else self.device)
        object.__setattr__(self, "masks", masks)

    def chunks(self) -> tuple[int, int]:
        """The indices of the two chunks of each sequence this rank holds."""
        return self.rank, 2 * self.size - 1 - self.rank

    def mask(self, half: int, chunk: int, like: torch.Tensor) -> torch.Tensor:
        """The causal mask of this rank's chunk ``half`` (0 early, 1 late), ``chunk`` tokens
        long, against the keys up to its end, for queries ``like``."""
        usual = chunk == self.seq_len // (2 * self.size) and like.device == self.device
        if usual and self.device.type == "cuda":
            return self.masks[half]
        key = (half, chunk, like.dtype, like.device)
        if key not in self.additive:
            allowed = self.masks[half] if usual else self._masks(chunk, like.device)[half]
            zeros = torch.zeros(allowed.shape, dtype=like.dtype, device=like.device)
            self.additive[key] = zeros.masked_fill_(~allowed, float("-inf"))
        return self.additive[key]

    def _masks(self, chunk: int, device: torch.device | None) -> tuple[torch.Tensor, ...]:
        seen = [(index + 1) * chunk for index in self.chunks()]
        if device is None:  # torch's bias, applied by the kernels
            return tuple(causal_lower_right(chunk, keys) for keys in seen)
        ones = [torch.ones(chunk, keys, dtype=torch.bool, device=device) for keys in seen]
        return tuple(m.tril(keys - chunk) for m, keys in zip(ones, seen, strict=True))


def sequence_share(tensor: torch.Tensor, rank: int, size: int, dim: int = 1) -> torch.Tensor:
    """The part of ``tensor`` (tokens, targets, ... with the sequence along ``dim``) that
    context-parallel rank ``rank`` of ``size`` holds: chunks rank and 2 x size - 1 - rank."""
    if size == 1:
        return tensor
    chunks = tensor.chunk(2 * size, dim=dim)
    return torch.cat([chunks[rank], chunks[2 * size - 1 - rank]], dim=dim)


def positions(local: int, rank: int, size: int, device: torch.device) -> torch.Tensor:
    """Global positions of the ``local`` tokens a rank holds (two chunks of local / 2)."""
    chunk = local // 2
    early = torch.arange(rank * chunk, (rank + 1) * chunk, device=device)
    late = torch.arange((2 * size - 1 - rank) * chunk, (2 * size - rank) * chunk, device=device)
    return torch.cat([early, late])


def gather_sequence(local: torch.Tensor, context: ContextGroup) -> torch.Tensor:
    """``local`` (stacked keys and values, (2, batch, local seq, heads, head_dim)) of every cp
    rank, in sequence order: (2, batch, seq, heads, head_dim)."""
    size = context.size
    gathered = all_gather_single_autograd(local, 0, context.group)
    two, batch, seq, heads, dim = local.shape
    # (rank, k/v, batch, [early, late], chunk, heads, head_dim)
    parts = gathered.view(size, two, batch, 2, seq // 2, heads, dim)
    early = parts[:, :, :, 0]  # chunk i on rank i
    late = parts.flip(0)[:, :, :, 1]  # chunk 2cp - 1 - i on rank i: reversed, in order
    ordered = torch.cat([early, late])  # (2cp chunks, k/v, batch, chunk, heads, head_dim)
    return ordered.permute(1, 2, 0, 3, 4, 5).reshape(two, batch, 2 * size * (seq // 2), heads, dim)


def context_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: ContextGroup
) -> torch.Tensor:
    """Causal attention of this rank's queries over the whole sequence.

    ``q`` (batch, local seq, heads, head_dim); ``k`` and ``v`` (batch, local seq, kv heads,
    head_dim), rotated at their global positions. Returns (batch, local seq, heads, head_dim).
    """
    kv = gather_sequence(torch.stack([k, v]), context)
    keys, values = kv[0], kv[1]
    repeats = q.shape[2] // keys.shape[2]
    if repeats > 1:
        keys = keys.repeat_interleave(repeats, dim=2)
        values = values.repeat_interleave(repeats, dim=2)
    keys, values = keys.transpose(1, 2), values.transpose(1, 2)
    chunk = q.shape[1] // 2
    outputs = []
    for half, index in enumerate(context.chunks()):
        query = q[:, half * chunk : (half + 1) * chunk].transpose(1, 2)
        seen = (index + 1) * chunk  # keys up to this chunk's end
        mask = context.mask(half, chunk, query)
        out = F.scaled_dot_product_attention(
            query, keys[:, :, :seen], values[:, :, :seen], attn_mask=mask
        )
        outputs.append(out.transpose(1, 2))
    return torch.cat(outputs, dim=1)
