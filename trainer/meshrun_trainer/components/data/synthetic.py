"""Deterministic training data: the same global batch for step k under every layout.

A batch is a pure function of (seed, step), so the data position saved in a checkpoint is the
step number and every data-parallel replica slices its rows out of the same global batch.
"""

from __future__ import annotations

from importlib import resources
from typing import Protocol

import torch

CORPUS_FILE = "corpus.txt"
"""Public-domain English text shipped in meshrun_trainer/data/ (sources listed in its header)."""


def encode(text: str) -> list[int]:
    """Byte-level tokenizer: UTF-8 bytes are the token ids (vocab 256, no downloads)."""
    return list(text.encode("utf-8"))


def decode(tokens: list[int]) -> str:
    return bytes(tokens).decode("utf-8", errors="replace")


def _generator(seed: int, step: int) -> torch.Generator:
    # One independent stream per (seed, step): no state to carry between steps.
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


class TokenStream(Protocol):
    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of shape (global_batch, seq_len) for optimizer step ``step``."""
        ...


class SyntheticStream:
    """Arithmetic progressions modulo the vocabulary: random start and stride per row.

    Learnable (the next token follows from the previous two), so the loss falls visibly.
    """

    def __init__(self, vocab: int, seq_len: int, batch: int, seed: int) -> None:
        self.vocab, self.seq_len, self.batch, self.seed = vocab, seq_len, batch, seed

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(self.seed, step)
        start = torch.randint(0, self.vocab, (self.batch, 1), generator=g)
        stride = torch.randint(1, min(self.vocab, 17), (self.batch, 1), generator=g)
        rows = (start + stride * torch.arange(self.seq_len + 1)) % self.vocab
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def load_corpus() -> torch.Tensor:
    text = resources.files("meshrun_trainer").joinpath("data", CORPUS_FILE).read_text("utf-8")
    return torch.tensor(encode(text), dtype=torch.long)


class CorpusStream:
    """Random windows of the shipped corpus, byte-tokenized."""

    def __init__(self, seq_len: int, batch: int, seed: int) -> None:
        self.tokens = load_corpus()
        if self.tokens.numel() <= seq_len + 1:
            raise ValueError(f"corpus has {self.tokens.numel()} bytes, needs > seq_len+1")
        self.seq_len, self.batch, self.seed = seq_len, batch, seed

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = _generator(self.seed, step)
        high = self.tokens.numel() - self.seq_len - 1
        offsets = torch.randint(0, high, (self.batch,), generator=g)
        index = offsets[:, None] + torch.arange(self.seq_len + 1)
        rows = self.tokens[index]
        return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


def make_stream(dataset: str, vocab: int, seq_len: int, batch: int, seed: int) -> TokenStream:
    if dataset == "corpus":
        return CorpusStream(seq_len, batch, seed)
    return SyntheticStream(vocab, seq_len, batch, seed)


def replica_rows(batch: torch.Tensor, dp_rank: int, dp: int) -> torch.Tensor:
    """This data-parallel replica's contiguous share of the global batch."""
    per = batch.shape[0] // dp
    return batch[dp_rank * per : (dp_rank + 1) * per]
