"""A token stream cut into training and validation windows, and opened once per dataset.

The token stream (documents + EOS in file order, meshrun_trainer.components.data.tokens) is cut from
the start into consecutive, non-overlapping windows of seqLen + 1 tokens; a last partial window is
dropped. Training visits every window once per epoch in a seeded order that changes each epoch;
the global batch of step k is a pure function of (seed, k), and every data-parallel replica
takes its own contiguous rows of it (data.replica_rows), so the shares are disjoint, no window
repeats within an epoch, and a resume from step k's checkpoint continues with batch k + 1.
Validation takes every window in file order.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from meshrun.api.errors import SpecError
from meshrun.api.spec import Data
from meshrun.files.data import cache_path, cache_trusted, check_dataset_size
from meshrun_trainer.components.data.tokens import load_tokens, tokenize


def cut_windows(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """(windows, seq_len + 1) view of the stream, the last partial window dropped."""
    count = len(tokens) // (seq_len + 1)
    return np.asarray(tokens[: count * (seq_len + 1)]).reshape(count, seq_len + 1)


class WindowStream:
    """Training windows, shuffled per epoch; ``global_batch(step)`` for step 1, 2, ..."""

    def __init__(self, tokens: np.ndarray, seq_len: int, batch: int, seed: int) -> None:
        self.windows = cut_windows(tokens, seq_len)
        self.batch, self.seed = batch, seed
        check_dataset_size(len(tokens), seq_len, batch, "spec.training.data.path")
        self.batches_per_epoch = len(self.windows) // batch
        self._order: tuple[int, np.ndarray] | None = None

    def epoch_of(self, step: int) -> int:
        """0-based epoch of 1-based ``step``."""
        return (step - 1) // self.batches_per_epoch

    def _permutation(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._order = (epoch, rng.permutation(len(self.windows)))
        return self._order[1]

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        epoch, index = divmod(step - 1, self.batches_per_epoch)
        rows = self._permutation(epoch)[index * self.batch : (index + 1) * self.batch]
        data = torch.from_numpy(self.windows[rows].astype(np.int64))
        return data[:, :-1].contiguous(), data[:, 1:].contiguous()

    def state_dict(self, step: int) -> dict[str, Any]:
        """The data position after ``step``: saved in the checkpoint."""
        return {
            "step": step,
            "epoch": step // self.batches_per_epoch,
            "batchInEpoch": step % self.batches_per_epoch,
            "windows": len(self.windows),
            "batch": self.batch,
            "seed": self.seed,
        }

    def resume_step(self, state: dict[str, Any]) -> int:
        """The step a checkpoint's data position continues after; refuses a changed dataset."""
        mine = self.state_dict(int(state["step"]))
        for key in ("windows", "batch", "seed"):
            if int(state[key]) != mine[key]:
                raise SpecError(
                    "spec.training.data",
                    f"the checkpoint was written with {key}={state[key]}, this run has "
                    f"{mine[key]}: the data changed, so the position cannot be resumed",
                )
        return int(state["step"])


def dataset_tokens(
    spec: Data, path: str, model_folder: Path | None, vocab: int, quiet: bool = False
) -> np.ndarray:
    """The dataset's token stream, tokenized once per dataset (rank 0 first, then one process
    per pod if its file system cannot see rank 0's cache) and memory-mapped by every rank."""
    if spec.format == "tokens":
        return load_tokens(Path(path), vocab)
    assert model_folder is not None, "text data needs the model folder (meshrun.rules.files)"
    out = cache_path(spec.format, path, spec.text_field, model_folder / "tokenizer.json", vocab)
    distributed = dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    for turn in ("first", "per-pod"):
        writer = rank == 0 if turn == "first" else os.environ.get("LOCAL_RANK", "0") == "0"
        if writer and not cache_trusted(out, spec.format, path):
            tokenize(spec.format, path, spec.text_field, model_folder, out, vocab, quiet)
        if distributed:
            dist.barrier()
    if not cache_trusted(out, spec.format, path):
        raise SpecError(
            "spec.training.data.path",
            f"{out}: the tokens cached for {path} were replaced by someone who cannot write the "
            "data (a link, another owner, or writable by others): not trained on",
        )
    return load_tokens(out, vocab)


def open_training(
    spec: Data, model_folder: Path | None, vocab: int, seq_len: int, batch: int, seed: int
) -> WindowStream:
    tokens = dataset_tokens(spec, spec.path, model_folder, vocab)
    return WindowStream(tokens, seq_len, batch, seed)


def open_validation(spec: Data, model_folder: Path | None, vocab: int, seq_len: int) -> np.ndarray:
    """Every validation window in file order, (windows, seq_len + 1)."""
    assert spec.validation is not None
    tokens = dataset_tokens(spec, spec.validation.path, model_folder, vocab)
    check_dataset_size(len(tokens), seq_len, 1, "spec.training.data.validation.path")
    return cut_windows(tokens, seq_len)
