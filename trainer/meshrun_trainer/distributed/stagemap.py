"""Which pipeline stages a rank holds, and what its micro-batch losses are divided by.

Plain arithmetic of the layout, apart from :mod:`meshrun_trainer.distributed.pipeline` so that
a process of a layout without pipelining never imports ``torch.distributed.pipelining``: that
import brings in ``torch._dynamo`` and costs 0.65 s of the trainer's 3 s start (measured with
``python -X importtime``), paid by every process of every job and test.
"""

from __future__ import annotations

from meshrun.api.layout import Layout


def stages_of_rank(pp_rank: int, layout: Layout) -> list[int]:
    """Global stage indices held by pipeline rank ``pp_rank``."""
    return [pp_rank + k * layout.pp for k in range(layout.virtual_stages)]


def loss_scale(layout: Layout) -> int:
    """What each micro-batch's mean loss is divided by, so that the gradients summed over one
    optimizer step are those of the mean loss over this replica's rows: micro-batches per
    ``step()`` times the ``step()`` calls per optimizer step (gradient accumulation)."""
    return layout.micro_batches * layout.grad_accumulation
