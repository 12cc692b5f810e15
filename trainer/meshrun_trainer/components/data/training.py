"""The training loop's data stream: the global batch of each step from the spec's data files
(``spec.training.data``) or, without them, from the synthetic stream (``spec.dataset``), and its
position, which a checkpoint keeps."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshrun_trainer.components.data.synthetic import TokenStream, make_stream
from meshrun_trainer.components.data.windows import WindowStream, open_training

if TYPE_CHECKING:
    import torch

    from meshrun.files.hf import HFModel
    from meshrun.jobdoc import JobDocument


class DataStream:
    """The same global batches on every rank, one per optimizer step (each rank takes its rows
    and its share of each sequence)."""

    def __init__(self, job: JobDocument, hf: HFModel | None) -> None:
        training, shape = job.spec.training, job.plan.model
        self.stream: TokenStream
        if training.data is None:
            self.stream = make_stream(
                job.spec.dataset,
                shape.vocab,
                shape.seq_len,
                training.global_batch_size,
                training.seed,
            )
        else:
            folder = hf.path if hf is not None else None
            self.stream = open_training(
                training.data,
                folder,
                shape.vocab,
                shape.seq_len,
                training.global_batch_size,
                training.seed,
            )

    def global_batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of the whole batch of 1-based ``step``."""
        return self.stream.global_batch(step)

    def state_dict(self, step: int) -> dict[str, Any] | None:
        """The position after ``step`` (None: the synthetic stream is a function of the step)."""
        return self.stream.state_dict(step) if isinstance(self.stream, WindowStream) else None

    def load_state_dict(self, step: int, state: dict[str, Any] | None) -> None:
        """Continue after ``step`` from a checkpoint's position; refuses a changed dataset."""
        if isinstance(self.stream, WindowStream) and state:
            position = self.stream.resume_step(state)
            assert position == step, f"data position {position} != checkpoint step {step}"
