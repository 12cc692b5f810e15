"""Pipeline parallelism with torch.distributed.pipelining.

Stage s of pp * v holds the layer range ``plan.stage_layers[s]``; rank r holds stages r, r + pp, ...
(the "loop" placement of Interleaved 1F1B, Narayanan et al. 2021). GPipe and 1F1B use v = 1.

With gradient accumulation the schedule runs once per accumulation step. At the end of each run
torch's stage hands FSDP2 its post-backward: reduce(-scatter) the gradients and reshard the
parameters. :class:`AccumulatingStage` does that only after the last run of the optimizer step:
before it, parameters stay gathered (no all-gather per accumulation step, as none happens per
micro-batch: see meshrun_trainer.distributed.parallel.apply_fsdp), and replicated gradients (HSDP)
are not all-reduced; sharded gradients (ZeRO-2/3) are still reduce-scattered each run, so that a
rank never holds the whole stage's gradients.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
)
from torch.distributed.pipelining.stage import _PipelineStageBase

from meshrun.api.layout import Layout
from meshrun_trainer.distributed.mesh import Mesh
from meshrun_trainer.distributed.parallel import DataParallel, data_parallel_kind
from meshrun_trainer.models.moe import not_counted

Schedule = PipelineScheduleSingle | PipelineScheduleMulti


class AccumulatingStage(PipelineStage):
    """A pipeline stage whose FSDP2 post-backward waits for the optimizer step's last run."""

    def __init__(self, *args: Any, replicated: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.replicated = replicated
        """Gradients are whole on every replica (HSDP): no need to reduce them before the end."""
        self.last_run = True
        """The next schedule run ends the optimizer step (set by the training loop)."""

    def perform_reduce_grad(self, grad_scale_factor: int) -> None:
        module = self.submod
        if self.last_run or not isinstance(module, FSDPModule):
            super().perform_reduce_grad(grad_scale_factor)
            return
        # torch's post-backward with the end-of-step switches off: keep parameters gathered,
        # reduce only gradients that are sharded.
        module.set_is_last_backward(False)
        module.set_reshard_after_backward(False)
        module.set_requires_gradient_sync(not self.replicated)
        state = fully_shard.state(module)  # type: ignore[attr-defined]
        for inner in state._state_ctx.all_states:
            for group in inner._fsdp_param_groups:
                group.post_backward()
        state._root_post_backward_final_callback()
        assert grad_scale_factor == 1, "the loss function carries the averaging (loss_scale)"

    # torch infers the shapes a stage sends by running it once, forward and backward, before
    # the first step: a mixture of experts counts neither its loads nor its auxiliary loss then.
    def _forward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
        with not_counted():
            return super()._forward_metadata_inference(*args, **kwargs)

    def _backward_metadata_inference(self, *args: Any, **kwargs: Any) -> Any:
        with not_counted():
            return super()._backward_metadata_inference(*args, **kwargs)


def build_schedule(
    parts: list[nn.Module],
    stage_ids: list[int],
    layout: Layout,
    mesh: Mesh,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Schedule:
    """Wrap each model chunk in a PipelineStage and build the configured schedule.

    ``loss_fn`` must already carry the whole averaging (see
    :func:`meshrun_trainer.distributed.stagemap.loss_scale`): the schedules'
    own ``scale_grads`` divides every ``.grad`` by the micro-batch count at the end of each
    ``step()``, including what earlier ``step()`` calls of the same optimizer step accumulated,
    so with gradient accumulation it would shrink the earlier contributions again and again.
    """
    group = mesh.group("pp")
    replicated = data_parallel_kind(layout) is DataParallel.HSDP_REPLICATE
    stages: list[_PipelineStageBase] = [
        AccumulatingStage(
            part, stage_id, layout.num_stages, mesh.device, group=group, replicated=replicated
        )
        for part, stage_id in zip(parts, stage_ids, strict=True)
    ]
    m = layout.micro_batches
    if layout.schedule == "gpipe":
        return ScheduleGPipe(stages[0], n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
    if layout.schedule == "1f1b":
        return Schedule1F1B(stages[0], n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
    return ScheduleInterleaved1F1B(stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=False)


def schedule_stages(schedule: Schedule) -> list[AccumulatingStage]:
    """The stages a schedule runs on this rank."""
    if isinstance(schedule, PipelineScheduleSingle):
        stages = [schedule._stage]
    else:
        stages = list(schedule._stages)
    return [stage for stage in stages if isinstance(stage, AccumulatingStage)]
