"""A Llama-family decoder: RMSNorm, rotary attention (grouped-query), SwiGLU MLP (or, with
``mlp: gelu``, the two-matrix GeLU MLP of GPT-style models).

The architecture features of Hugging Face's Llama, Mistral and Qwen2 come from the shape: RoPE
base and Llama 3 scaling, q/k/v (and output) projection bias, RMSNorm epsilon, an explicit head
size, and an output head tied to the input embedding. Module names follow torchtitan's Llama
(tok_embeddings, layers.<i>.attention.wq, ..., norm, output) so the tensor-parallel plan reads
the same; :func:`meshrun_trainer.models.hf.hf_key` maps them to transformers' names. ``layers``
is a ModuleDict keyed by the global layer index: a pipeline stage keeps the same parameter names
as the full model, which keeps checkpoints valid across layouts.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from meshrun.api.presets import ModelShape
from meshrun_trainer.models.context import ContextGroup, context_attention, positions
from meshrun_trainer.models.materialize import SeededInit, materialize
from meshrun_trainer.models.moe import MoE


def rotary_frequencies(shape: ModelShape) -> torch.Tensor:
    """Inverse frequencies theta^(-2i/d), with Llama 3's scaling when the shape has it.

    Llama 3 (Meta's reference code, as transformers' ``rope_type: llama3``): wavelengths longer
    than ``original / low_freq_factor`` are divided by ``factor``, shorter than ``original /
    high_freq_factor`` kept, and those in between interpolated smoothly.
    """
    half = shape.head_dim // 2
    freqs = 1.0 / (shape.rope_theta ** (torch.arange(0, half, dtype=torch.float32) / half))
    scaling = shape.rope_scaling
    if scaling is None:
        return freqs
    wavelength = 2 * math.pi / freqs
    low = scaling.original_max_position / scaling.low_freq_factor
    high = scaling.original_max_position / scaling.high_freq_factor
    scaled = torch.where(wavelength > low, freqs / scaling.factor, freqs)
    smooth = (scaling.original_max_position / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = (wavelength >= high) & (wavelength <= low)
    return torch.where(medium, smoothed, scaled)


def rotary_tables(shape: ModelShape) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (seq_len, head_dim) for rotary embeddings (Su et al. 2021)."""
    freqs = rotary_frequencies(shape)
    angles = torch.outer(torch.arange(shape.seq_len, dtype=torch.float32), freqs)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def _apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x: (batch, seq, heads, head_dim); the "rotate half" form used by Hugging Face Llama.
    seq = x.shape[1]
    cos_s, sin_s = cos[:seq, None, :].to(x.dtype), sin[:seq, None, :].to(x.dtype)
    first, second = x.chunk(2, dim=-1)
    rotated = torch.cat([-second, first], dim=-1)
    return x * cos_s + rotated * sin_s


class Attention(nn.Module):
    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.head_dim = shape.head_dim
        q, kv, bias = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.qkv_bias
        self.wq = nn.Linear(shape.hidden, q, bias=bias)
        self.wk = nn.Linear(shape.hidden, kv, bias=bias)
        self.wv = nn.Linear(shape.hidden, kv, bias=bias)
        self.wo = nn.Linear(q, shape.hidden, bias=shape.output_bias)
        self.context: ContextGroup | None = None
        """Set under context parallelism: x holds this rank's two chunks of each sequence
        (meshrun_trainer.models.context)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds heads / tp of them.
        q = self.wq(x).view(batch, seq, -1, self.head_dim)
        k = self.wk(x).view(batch, seq, -1, self.head_dim)
        v = self.wv(x).view(batch, seq, -1, self.head_dim)
        context = self.context
        if context is not None:  # the tables' rows at the tokens' global positions
            held = positions(seq, context.rank, context.size, cos.device)
            cos, sin = cos[held], sin[held]
        q, k = _apply_rotary(q, cos, sin), _apply_rotary(k, cos, sin)
        if context is not None:
            out = context_attention(q, k, v, context)
            result: torch.Tensor = self.wo(out.reshape(batch, seq, -1))
            return result
        repeats = q.shape[2] // k.shape[2]
        if repeats > 1:
            k = k.repeat_interleave(repeats, dim=2)
            v = v.repeat_interleave(repeats, dim=2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        result = self.wo(out.transpose(1, 2).reshape(batch, seq, -1))
        return result


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.hidden, shape.ffn_hidden, bias=False)
        self.w2 = nn.Linear(shape.ffn_hidden, shape.hidden, bias=False)
        self.w3 = nn.Linear(shape.hidden, shape.ffn_hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.w2(F.silu(self.w1(x)) * self.w3(x))
        return result


class GeluFeedForward(nn.Module):
    """The two-matrix MLP of GPT-2/3 and GPT-NeoX: ``w2(gelu(w1 x))``, w1 the up projection
    (column-parallel under TP, as SwiGLU's w1) and w2 the down projection (row-parallel)."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.w1 = nn.Linear(shape.hidden, shape.ffn_hidden, bias=False)
        self.w2 = nn.Linear(shape.ffn_hidden, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.w2(F.gelu(self.w1(x)))
        return result


class TransformerBlock(nn.Module):
    """Attention and an MLP: the dense SwiGLU or GeLU MLP (``feed_forward``), or a mixture of
    experts (``moe``, :mod:`meshrun_trainer.models.moe`) in a MoE layer."""

    def __init__(self, shape: ModelShape, layer: int = 0) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(shape.hidden, eps=shape.norm_eps)
        self.attention = Attention(shape)
        self.ffn_norm = nn.RMSNorm(shape.hidden, eps=shape.norm_eps)
        self.feed_forward: FeedForward | GeluFeedForward | None = None
        self.moe: MoE | None = None
        if shape.moe is not None and shape.moe.is_moe_layer(layer):
            self.moe = MoE(shape)
        else:
            self.feed_forward = (
                FeedForward(shape) if shape.mlp == "swiglu" else GeluFeedForward(shape)
            )

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        mlp = self.moe if self.moe is not None else self.feed_forward
        assert mlp is not None
        out: torch.Tensor = h + mlp(self.ffn_norm(h))
        return out


class Transformer(nn.Module):
    """The whole decoder, or one pipeline stage of it after :meth:`keep_layers`."""

    def __init__(self, shape: ModelShape, autocast_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.shape = shape
        self.autocast_dtype = autocast_dtype
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleDict(
            {str(i): TransformerBlock(shape, i) for i in range(shape.layers)}
        )
        self.norm: nn.RMSNorm | None = nn.RMSNorm(shape.hidden, eps=shape.norm_eps)
        self.output: nn.Linear | None = nn.Linear(shape.hidden, shape.vocab, bias=False)
        if shape.tie_embeddings:
            self.tie()
        cos, sin = rotary_tables(shape)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def tie(self) -> None:
        """Share the input embedding's weight with the output head (when both are here)."""
        tied = self.shape.tie_embeddings
        if tied and self.tok_embeddings is not None and self.output is not None:
            self.output.weight = self.tok_embeddings.weight

    def split_sequences(self, context: ContextGroup) -> None:
        """Run on this rank's share of every sequence (context parallelism): each attention
        gathers the keys and values of the others."""
        for block in self.layers.values():
            attention = block.get_submodule("attention")
            assert isinstance(attention, Attention)
            attention.context = context

    def reset_buffers(self) -> None:
        """Recompute the rotary tables in place (a model built on the meta device gets garbage
        in its non-persistent buffers from ``to_empty``)."""
        cos, sin = rotary_tables(self.shape)
        with torch.no_grad():
            self.get_buffer("rope_cos").copy_(cos)
            self.get_buffer("rope_sin").copy_(sin)

    def keep_layers(self, first: int, last: int) -> None:
        """Turn the full model into the pipeline stage holding layers first..last (inclusive).

        With tied embeddings the last stage keeps its own copy of the embedding as the head;
        :mod:`meshrun_trainer.distributed.tying` keeps the two copies' gradients equal.
        """
        for index in list(self.layers.keys()):
            if not first <= int(index) <= last:
                del self.layers[index]
        if first > 0:
            self.tok_embeddings = None
        if last < self.shape.layers - 1:
            self.norm = None
            self.output = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (first stage) or hidden states (later stages) to logits or hidden states."""
        enabled = self.autocast_dtype is not None
        with torch.autocast(x.device.type, dtype=self.autocast_dtype, enabled=enabled):
            h = x
            if self.tok_embeddings is not None:
                h = self.tok_embeddings(x)
                if self.autocast_dtype is not None:
                    # The residual stream (and what a stage sends) in the compute dtype.
                    h = h.to(self.autocast_dtype)
            cos, sin = self.rope_cos, self.rope_sin
            for layer in self.layers.values():
                h = layer(h, cos, sin)
            if self.norm is not None:
                h = self.norm(h)
            if self.output is not None:
                h = self.output(h)
        return h


def build_model(
    shape: ModelShape, seed: int, layers: tuple[int, int] | None = None, bf16: bool = False
) -> Transformer:
    """The model (or the pipeline stage holding ``layers``) on the CPU, initialised from ``seed``.

    Built on the meta device and materialized after the cut, so a stage never allocates the
    other stages; each parameter's values depend only on (seed, name), identical for every
    layout (:class:`meshrun_trainer.models.materialize.SeededInit`).
    """
    with torch.device("meta"):
        model = Transformer(shape, autocast_dtype=torch.bfloat16 if bf16 else None)
    if layers is not None:
        model.keep_layers(*layers)
    materialize([model], torch.device("cpu"), SeededInit(seed, shape.tie_embeddings))
    return model
