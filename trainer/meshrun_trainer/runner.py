"""The trainer's handle on one rank: its parallelised model parts, their optimizers, the pipeline
schedule, and the records a run leaves (shared by the loop and the components it calls)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import loss_parallel
from torch.nn.parallel import DistributedDataParallel

if TYPE_CHECKING:
    from meshrun_trainer.distributed.pipeline import AccumulatingStage, Schedule


@dataclass(frozen=True)
class StepRecord:
    """What one optimizer step measured."""

    step: int
    """1-based optimizer step."""
    loss: float
    """Mean loss over the whole global batch (identical on every rank)."""
    grad_norm: float
    """Global gradient norm before clipping."""
    learning_rate: float
    """The learning rate this step's update used (the schedule's value)."""
    step_time_s: float
    """Wall time of the step on this rank."""
    tokens_per_s: float
    """Global batch tokens divided by the step time."""
    peak_memory_bytes: int
    """This rank's peak memory so far (see :func:`peak_memory`)."""


@dataclass
class TrainResult:
    """The outcome of :func:`train` on one rank."""

    records: list[StepRecord] = field(default_factory=list)
    """One record per step run in this process (restored steps excluded)."""
    resumed_from: int = 0
    """Step of the checkpoint this run started from (0: fresh start)."""
    evals: list[dict[str, Any]] = field(default_factory=list)
    """Validation losses {"step", "loss"} (step 0: before training), restored ones included."""


@dataclass
class Runner:
    """The parallelised model parts of this rank, their optimizers and the pipeline schedule."""

    parts: list[nn.Module]
    """Model chunks of this rank (one unless interleaved), possibly DDP-wrapped."""
    optimizers: list[torch.optim.Optimizer]
    """One optimizer per part (so checkpoint state maps to parts)."""
    schedule: Schedule | None
    """Pipeline schedule, None when pp == 1."""
    is_first: bool
    """This rank feeds token ids (holds the first stage)."""
    is_last: bool
    """This rank computes the loss (holds the last stage)."""
    loss_parallel: bool = False
    """The logits stay sharded over the vocabulary (TP): compute the loss in loss_context()."""
    context: dist.ProcessGroup | None = None
    """The context-parallel group holding the rest of this rank's sequences (cp > 1)."""

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters()]

    def modules(self) -> list[nn.Module]:
        """The model chunks without their DDP wrapper (parameter names as in the model)."""
        return [p.module if isinstance(p, DistributedDataParallel) else p for p in self.parts]

    def pipeline_stages(self) -> list[AccumulatingStage]:
        """The pipeline stages the schedule runs on this rank (none when pp == 1)."""
        if self.schedule is None:
            return []
        # imported here: torch.distributed.pipelining costs every process 0.65 s (stagemap.py)
        from meshrun_trainer.distributed.pipeline import schedule_stages

        return schedule_stages(self.schedule)

    def loss_context(self) -> AbstractContextManager[None]:
        """Where the loss and its backward run: torch's loss_parallel() for sharded logits."""
        return loss_parallel() if self.loss_parallel else nullcontext()
