"""Tied embeddings across pipeline stages (``tieEmbeddings`` with pp > 1): the first stage
holds the input embedding, the last the output head, two copies of one weight; their gradients
are summed over the first and last stage after backward, so both copies take the same update
(Megatron-LM's embedding group)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrun_trainer.distributed.tying import embedding_group, sync_tied_gradients, tied_parameters

if TYPE_CHECKING:
    import torch.distributed as dist
    from torch import nn

    from meshrun.jobdoc import JobDocument
    from meshrun_trainer.distributed.mesh import Mesh
    from meshrun_trainer.runner import Runner


class TiedGradients:
    """The tied copies on this rank and the group that sums their gradients (none: nothing to
    do); set up on every rank, since the group is made collectively."""

    def __init__(self, job: JobDocument, mesh: Mesh, runner: Runner) -> None:
        self.copies: list[nn.Parameter] = []
        """The embedding on the first stage, the head on the last."""
        self.duplicates: list[nn.Parameter] = []
        """Copies the global gradient norm leaves out (the last stage's: counted once)."""
        self.group: dist.ProcessGroup | None = None
        if job.plan.model.tie_embeddings and job.plan.layout.pp > 1:
            self.group = embedding_group(mesh)
            self.copies = tied_parameters(runner.modules())
            self.duplicates = [] if runner.is_first else self.copies

    def sync(self) -> None:
        """Sum the copies' gradients over the first and last stage (after backward)."""
        sync_tied_gradients(self.copies, self.group)
