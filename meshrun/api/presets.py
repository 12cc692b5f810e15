"""Named model sizes shared by the planner and the trainer.

The architecture is Llama-like: RMSNorm, rotary attention (grouped-query when ``kv_heads`` is
below ``heads``), a SwiGLU MLP (or the two-matrix GeLU MLP of GPT-style models), untied input
embedding and output head. Shapes follow the published Llama 2 configurations for 7b/13b/70b;
``tiny`` is small enough for CPU tests and still divides by every tensor-parallel degree the
tests use (1, 2, 4). The architecture fields (RoPE base and scaling, tied embeddings, q/k/v bias,
norm epsilon, explicit head size, the MLP) default to Llama 2's choices; a Hugging Face
``config.json`` sets them (meshrun.files.hf).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from meshrun.api.moe import MoeShape

Mlp = Literal["swiglu", "gelu"]
"""A block's MLP: SwiGLU, ``w2(silu(w1 x) * w3 x)`` (Shazeer 2020; Llama, Mistral, Qwen2), or
the two-matrix ``w2(gelu(w1 x))`` of GPT-2/3, GPT-NeoX, Falcon, MPT, BLOOM and Phi."""
MLP_MATRICES: dict[str, int] = {"swiglu": 3, "gelu": 2}
"""Weight matrices of h x f in each MLP."""


@dataclass(frozen=True)
class RopeScaling:
    """Llama 3's frequency-dependent RoPE scaling (``rope_type: llama3`` in config.json)."""

    factor: float
    """Wavelengths beyond ``original_max_position / low_freq_factor`` are stretched by this."""
    low_freq_factor: float
    """Below this many rotations over the original context a frequency is fully scaled."""
    high_freq_factor: float
    """Above this many rotations a frequency is left alone; in between it is interpolated."""
    original_max_position: int
    """The context length the model was pretrained with."""


@dataclass(frozen=True)
class ModelShape:
    """The shape of a decoder-only transformer."""

    layers: int
    """Number of transformer blocks."""
    hidden: int
    """Model width h."""
    heads: int
    """Attention heads a."""
    vocab: int
    """Vocabulary size."""
    seq_len: int
    """Training sequence length s."""
    ffn_hidden: int
    """The MLP's hidden size f (its inner width)."""
    kv_heads: int
    """Key/value heads (grouped-query attention); equal to ``heads`` for plain attention."""
    head_size: int = 0
    """Width of one attention head; 0 means ``hidden // heads`` (config.json's ``head_dim``)."""
    rope_theta: float = 10000.0
    """RoPE base (Su et al. 2021); Llama 3 uses 500000."""
    rope_scaling: RopeScaling | None = None
    """Llama 3 RoPE scaling, or None for plain RoPE."""
    tie_embeddings: bool = False
    """The output head shares the input embedding's weight (counted once)."""
    qkv_bias: bool = False
    """The query, key and value projections have a bias (Qwen2)."""
    output_bias: bool = False
    """The attention output projection has a bias (Llama's ``attention_bias``)."""
    norm_eps: float = 1e-5
    """RMSNorm epsilon."""
    architecture: str = "llama"
    """Hugging Face ``model_type`` of this architecture (llama, mistral, qwen2, mixtral or
    qwen2_moe; a GeLU family's for ``mlp: gelu``)."""
    moe: MoeShape | None = None
    """The mixture of experts of the MoE layers, or None for a dense model."""
    mlp: Mlp = "swiglu"
    """The dense MLP: three h x f matrices (swiglu) or two (gelu)."""

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    def attention_parameters(self) -> int:
        """One block's attention projections (with their biases) and its two norms."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        attention = 2 * self.hidden * q + 2 * self.hidden * kv
        biases = (q + 2 * kv if self.qkv_bias else 0) + (self.hidden if self.output_bias else 0)
        return attention + biases + 2 * self.hidden

    def mlp_parameters(self, layer: int, active: bool = False) -> int:
        """Block ``layer``'s MLP: the dense SwiGLU or GeLU MLP, or a MoE layer's experts (all
        of them, or with ``active`` the k routed ones a token visits), router and shared
        experts."""
        moe = self.moe
        if moe is None or not moe.is_moe_layer(layer):
            return MLP_MATRICES[self.mlp] * self.hidden * self.ffn_hidden
        if active:
            return moe.active_parameters(self.hidden)
        return moe.routed_parameters(self.hidden) + moe.fixed_parameters(self.hidden)

    def layer_parameters(self) -> int:
        """Parameters of the largest transformer block (attention, MLP or all of a MoE layer's
        experts, two norms)."""
        return self.attention_parameters() + self.mlp_parameters(self.layers - 1)

    def embedding_parameters(self) -> int:
        """Input embedding, the output head unless tied to it, and the final norm."""
        tables = 1 if self.tie_embeddings else 2
        return tables * self.vocab * self.hidden + self.hidden

    def parameters(self, active: bool = False) -> int:
        """Every parameter, or with ``active`` those one token uses (a MoE layer's k routed
        experts rather than all of them)."""
        mlp = sum(self.mlp_parameters(layer, active) for layer in range(self.layers))
        return self.layers * self.attention_parameters() + mlp + self.embedding_parameters()


SIZES = {
    "layers": "layers",
    "hidden": "hidden",
    "heads": "heads",
    "kv_heads": "kvHeads",
    "vocab": "vocab",
    "seq_len": "seqLen",
    "ffn_hidden": "ffnHidden",
}
"""The seven sizes of a model: ModelShape field -> its ``spec.model`` key (and the plan's)."""
REQUIRED_SIZES = ("layers", "hidden", "heads", "vocab", "seq_len")
"""The sizes a model without a preset must give (ffnHidden and kvHeads follow from them)."""


def sizes_of(source: object) -> dict[str, int | None]:
    """The seven sizes of ``source`` (a ModelShape, or spec.model with unset ones None)."""
    return {name: getattr(source, name) for name in SIZES}


PRESETS: dict[str, ModelShape] = {
    "tiny": ModelShape(
        layers=4, hidden=64, heads=4, vocab=256, seq_len=64, ffn_hidden=192, kv_heads=4
    ),
    "small": ModelShape(
        layers=12, hidden=768, heads=12, vocab=32000, seq_len=1024, ffn_hidden=2048, kv_heads=12
    ),
    "1b": ModelShape(
        layers=16, hidden=2048, heads=16, vocab=32000, seq_len=2048, ffn_hidden=5632, kv_heads=16
    ),
    "7b": ModelShape(
        layers=32, hidden=4096, heads=32, vocab=32000, seq_len=4096, ffn_hidden=11008, kv_heads=32
    ),
    "13b": ModelShape(
        layers=40, hidden=5120, heads=40, vocab=32000, seq_len=4096, ffn_hidden=13824, kv_heads=40
    ),
    "70b": ModelShape(
        layers=80, hidden=8192, heads=64, vocab=32000, seq_len=4096, ffn_hidden=28672, kv_heads=8
    ),
    # Qwen1.5-MoE-A2.7B's shape (60 experts of 1408, top 4, four shared), 14.3B parameters of
    # which 2.7B are active per token, with meshrun's untied head.
    "moe-small": ModelShape(
        layers=24,
        hidden=2048,
        heads=16,
        vocab=151936,
        seq_len=4096,
        ffn_hidden=5632,
        kv_heads=16,
        moe=MoeShape(experts=60, experts_per_token=4, expert_ffn_hidden=1408, shared_experts=4),
    ),
    # Mixtral 8x7B's shape: 8 experts of 14336, top 2, 46.7B parameters, 12.9B active.
    "moe-large": ModelShape(
        layers=32,
        hidden=4096,
        heads=32,
        vocab=32000,
        seq_len=4096,
        ffn_hidden=14336,
        kv_heads=8,
        rope_theta=1e6,
        moe=MoeShape(experts=8, experts_per_token=2, expert_ffn_hidden=14336),
    ),
}
