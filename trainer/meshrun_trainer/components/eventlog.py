"""Rank 0's TensorBoard event files (spec.training.metrics): one event per step, one per
validation, flushed every :data:`FLUSH_SECONDS`, at each checkpoint's step and at the end
(docs/trainer.md, "The metrics")."""

from __future__ import annotations

import sys
import time

from meshrun.files import events
from meshrun.jobdoc import JobDocument
from meshrun_trainer.runner import StepRecord

FLUSH_SECONDS = 10.0
"""As often as the operator writes status.progress by default (its --status-interval-seconds):
what a user sees in TensorBoard is no older than what kubectl shows."""


class EventLog:
    """Writes the job's scalar series into ``folder``.

    The file is opened at the first value this process writes, and tells readers to drop every
    value an earlier file holds from that step on: a run resumed from the checkpoint at step 40
    after its dead predecessor logged up to 47 shows steps 41 to 47 once, from this run.
    A folder that cannot be written is reported once and training goes on without it.
    """

    def __init__(self, folder: str, job: JobDocument) -> None:
        self.folder = folder
        self.predicted = job.plan.predicted_tokens_per_second()
        self.checkpoint_every = job.spec.training.checkpoint.every_steps
        self.writer: events.EventWriter | None = None
        self.broken = False
        self.flushed = time.monotonic()

    def step(self, record: StepRecord) -> None:
        values = {
            events.LOSS: record.loss,
            events.LEARNING_RATE: record.learning_rate,
            events.GRAD_NORM: record.grad_norm,
            events.TOKENS_PER_SECOND: record.tokens_per_s,
            events.STEP_SECONDS: record.step_time_s,
        }
        if self.predicted is not None:
            values[events.PREDICTED_TOKENS_PER_SECOND] = self.predicted
        self._write(record.step, values)

    def evaluation(self, step: int, loss: float) -> None:
        self._write(step, {events.EVAL_LOSS: loss})

    def _write(self, step: int, values: dict[str, float]) -> None:
        if self.broken:
            return
        try:
            if self.writer is None:
                self.writer = events.EventWriter(self.folder, purge_from=step)
            self.writer.scalars(step, values)
            # At a checkpoint's step too (reported before it is saved): a pod killed later
            # loses no step that a resume from that checkpoint would not run again.
            at_checkpoint = self.checkpoint_every and step % self.checkpoint_every == 0
            if at_checkpoint or time.monotonic() - self.flushed >= FLUSH_SECONDS:
                self.writer.flush()
                self.flushed = time.monotonic()
        except OSError as error:  # a full or read-only volume must not stop training
            self.broken = True
            print(f"meshrun-trainer: TensorBoard event files disabled: {error}", file=sys.stderr)

    def close(self) -> None:
        if self.writer is None or self.broken:
            return
        try:
            self.writer.close()
        except OSError as error:
            print(f"meshrun-trainer: TensorBoard event files: {error}", file=sys.stderr)
