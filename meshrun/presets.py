"""Named model sizes shared by the planner and the trainer.

The architecture is Llama-like: RMSNorm, rotary attention (grouped-query when ``kv_heads`` is
below ``heads``), a SwiGLU MLP, untied input embedding and output head. Shapes follow the
published Llama 2 configurations for 7b/13b/70b; ``tiny`` is small enough for CPU tests and
still divides by every tensor-parallel degree the tests use (1, 2, 4).
"""

from __future__ import annotations

from dataclasses import dataclass


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
    """Inner width of the SwiGLU MLP."""
    kv_heads: int
    """Key/value heads (grouped-query attention); equal to ``heads`` for plain attention."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def layer_parameters(self) -> int:
        """Parameters of one transformer block (attention, MLP, two norms)."""
        kv = self.kv_heads * self.head_dim
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * kv
        mlp = 3 * self.hidden * self.ffn_hidden
        return attention + mlp + 2 * self.hidden

    def embedding_parameters(self) -> int:
        """Input embedding plus the untied output head and the final norm."""
        return 2 * self.vocab * self.hidden + self.hidden

    def parameters(self) -> int:
        return self.layers * self.layer_parameters() + self.embedding_parameters()


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
}
