"""Pipeline parallelism with torch.distributed.pipelining.

Stage s of pp * v holds the layer range ``stage_layers[s]``; rank r holds stages r, r + pp, ...
(the "loop" placement of Interleaved 1F1B, Narayanan et al. 2021). GPipe and 1F1B use v = 1.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining.stage import _PipelineStageBase

from meshrun_trainer.config import Layout
from meshrun_trainer.mesh import Mesh

Schedule = PipelineScheduleSingle | PipelineScheduleMulti


def stages_of_rank(pp_rank: int, layout: Layout) -> list[int]:
    """Global stage indices held by pipeline rank ``pp_rank``."""
    return [pp_rank + k * layout.pp for k in range(layout.virtual_stages)]


def build_schedule(
    parts: list[nn.Module],
    stage_ids: list[int],
    layout: Layout,
    mesh: Mesh,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Schedule:
    """Wrap each model chunk in a PipelineStage and build the configured schedule.

    ``loss_fn`` must already carry the whole averaging (see :func:`loss_scale`): the schedules'
    own ``scale_grads`` divides every ``.grad`` by the micro-batch count at the end of each
    ``step()``, including what earlier ``step()`` calls of the same optimizer step accumulated,
    so with gradient accumulation it would shrink the earlier contributions again and again.
    """
    group = mesh.group("pp")
    stages: list[_PipelineStageBase] = [
        PipelineStage(part, stage_id, layout.num_stages, mesh.device, group=group)
        for part, stage_id in zip(parts, stage_ids, strict=True)
    ]
    m = layout.micro_batches
    if layout.schedule == "gpipe":
        return ScheduleGPipe(stages[0], n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
    if layout.schedule == "1f1b":
        return Schedule1F1B(stages[0], n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
    return ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=False)


def loss_scale(layout: Layout) -> int:
    """What each micro-batch's mean loss is divided by, so that the gradients summed over one
    optimizer step are those of the mean loss over this replica's rows: micro-batches per
    ``step()`` times the ``step()`` calls per optimizer step (gradient accumulation)."""
    return layout.micro_batches * layout.grad_accumulation
