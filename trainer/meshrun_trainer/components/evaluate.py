"""The validation loss under any layout: the mean next-token cross-entropy over every predicted
token of every validation window (meshrun_trainer.components.data.windows).

Windows go to the data-parallel replicas in blocks shaped like one training call (the rows a
replica feeds per forward pass), so pipeline stages see the shapes they were built for; a last
short block is padded with rows whose targets are ignored. Every replica sums its loss and
counts its tokens, and the sums meet in one all-reduce. Under context parallelism each rank
takes its share of every window (meshrun_trainer.models.context) and the sums meet over dp x cp.
:class:`Validator` runs it when the training loop should.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from meshrun_trainer.components.data.windows import open_validation
from meshrun_trainer.distributed.parallel import end_forward_only
from meshrun_trainer.distributed.stagemap import loss_scale
from meshrun_trainer.models.context import sequence_share

if TYPE_CHECKING:
    from meshrun.api.layout import Layout
    from meshrun.files.hf import HFModel
    from meshrun.jobdoc import JobDocument
    from meshrun_trainer.distributed.mesh import Mesh
    from meshrun_trainer.runner import Runner

IGNORE = -100
"""Target of padding rows: F.cross_entropy leaves it out of the mean."""


def _block(
    windows: np.ndarray, start: int, rows: int, dp: int, dp_rank: int
) -> tuple[torch.Tensor, torch.Tensor]:
    block = torch.from_numpy(windows[start : start + rows * dp].astype(np.int64))
    inputs = torch.zeros((rows * dp, block.shape[1] - 1), dtype=torch.long)
    targets = torch.full_like(inputs, IGNORE)
    inputs[: len(block)], targets[: len(block)] = block[:, :-1], block[:, 1:]
    mine = slice(dp_rank * rows, (dp_rank + 1) * rows)
    return inputs[mine], targets[mine]


def _loss_context(runner: Runner) -> AbstractContextManager[Any]:
    """Where the training loop computes its loss (loss_parallel for vocabulary-sharded logits)."""
    context = getattr(runner, "loss_context", None)
    return context() if context is not None else nullcontext()


def _summed_loss(
    layout: Layout, runner: Runner, inputs: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """Sum of the token losses of these rows (0 on ranks that never see the loss)."""
    if runner.schedule is None:
        logits = runner.parts[0](inputs).float()
        with _loss_context(runner):  # vocabulary-sharded logits under tensor parallelism
            loss = F.cross_entropy(
                logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction="sum"
            )
        return loss.full_tensor() if isinstance(loss, DTensor) else loss
    losses: list[torch.Tensor] = []
    args = (inputs,) if runner.is_first else ()
    with _loss_context(runner):
        if not runner.is_last:
            runner.schedule.eval(*args)
            return torch.zeros((), device=inputs.device)
        runner.schedule.eval(*args, target=targets, losses=losses)
    # Each micro-batch's loss is its token mean divided by the schedule's loss scale (under
    # context parallelism: its share of the group's mean, times cp).
    counts = torch.stack([(t != IGNORE).sum() for t in targets.chunk(len(losses))]).float()
    if runner.context is not None:
        dist.all_reduce(counts, group=runner.context)
        counts /= layout.cp
    scale = loss_scale(layout)
    total = torch.zeros((), device=inputs.device)
    for loss, count in zip(losses, counts.tolist(), strict=True):
        if count:
            value = loss.full_tensor() if isinstance(loss, DTensor) else loss
            total += value.detach().float() * scale * count
    return total


@torch.no_grad()
def validation_loss(job: JobDocument, runner: Runner, mesh: Mesh, windows: np.ndarray) -> float:
    """The validation loss, identical on every rank; collective."""
    layout = job.plan.layout
    rows = job.spec.training.global_batch_size // layout.dp // layout.grad_accumulation
    sums = torch.zeros(2, dtype=torch.float64, device=mesh.device)
    for start in range(0, len(windows), rows * layout.dp):
        inputs, targets = _block(windows, start, rows, layout.dp, mesh.dp_rank)
        inputs = sequence_share(inputs, mesh.cp_rank, layout.cp)
        targets = sequence_share(targets, mesh.cp_rank, layout.cp)
        loss = _summed_loss(layout, runner, inputs.to(mesh.device), targets.to(mesh.device))
        sums[0] += loss.double()
        if runner.is_last:
            sums[1] += int((targets != IGNORE).sum())
    end_forward_only(runner.parts)  # FSDP2 units gathered by these forward passes
    if layout.pp > 1:
        dist.all_reduce(sums, group=mesh.group("pp"))  # only the last stage holds the sums
    if layout.dp * layout.cp > 1:
        dist.all_reduce(sums, group=mesh.gradient_group())
    return float(sums[0] / sums[1])


class Validator:
    """Validation on ``spec.training.data.validation`` (torchtitan's Validator): before
    training, every ``evalEverySteps`` and after the last step; the losses so far, which a
    checkpoint keeps. Every rank makes the same calls (each validation is collective)."""

    def __init__(self, job: JobDocument, hf: HFModel | None, mesh: Mesh, runner: Runner) -> None:
        self.job, self.mesh, self.runner = job, mesh, runner
        data, shape = job.spec.training.data, job.plan.model
        self.windows: np.ndarray | None = None
        """The validation windows; None: no validation."""
        self.every = data.eval_every_steps if data is not None else 0
        self.evals: list[dict[str, Any]] = []
        """{"step", "loss"} of each validation so far (restored ones included)."""
        if data is not None and data.validation is not None:
            folder = hf.path if hf is not None else None
            self.windows = open_validation(data, folder, shape.vocab, shape.seq_len)

    def validate(self, step: int) -> float | None:
        """The validation loss after ``step`` (None: no validation data)."""
        if self.windows is None:
            return None
        loss = validation_loss(self.job, self.runner, self.mesh, self.windows)
        self.evals.append({"step": step, "loss": loss})
        return loss

    def after_step(self, step: int) -> float | None:
        """Validate when due (not after the last step: :meth:`finish` does)."""
        if self.every and step % self.every == 0 and step < self.job.spec.training.steps:
            return self.validate(step)
        return None

    def finish(self, step: int) -> float | None:
        """The last validation, unless one already ran at ``step``."""
        if any(e["step"] == step for e in self.evals):
            return None
        return self.validate(step)

    def state_dict(self) -> list[dict[str, Any]]:
        return list(self.evals)

    def load_state_dict(self, evals: list[dict[str, Any]]) -> None:
        self.evals = list(evals)
