"""The training loop's hooks for a job's own parts (``spec.model.hf``, ``spec.training.data``,
``lrSchedule``, ``export``; the folder opened by meshrun_trainer.config.files): where the
initial weights come from (:func:`weight_source`), the data stream and its position, tied-embedding
gradients across pipeline stages, the learning-rate schedule, validation, and the export."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from torch.optim.lr_scheduler import LambdaLR

from meshrun_trainer.components.data.synthetic import TokenStream, make_stream
from meshrun_trainer.components.data.windows import WindowStream, open_training, open_validation
from meshrun_trainer.components.evaluate import validation_loss
from meshrun_trainer.components.optim import make_scheduler
from meshrun_trainer.distributed.tying import embedding_group, sync_tied_gradients, tied_parameters
from meshrun_trainer.models.hf import SafetensorsSource, export

if TYPE_CHECKING:
    from torch import nn

    from meshrun.api.presets import ModelShape
    from meshrun.files.hf import HFModel
    from meshrun.jobdoc import JobDocument
    from meshrun_trainer.distributed.mesh import Mesh
    from meshrun_trainer.models.materialize import WeightSource
    from meshrun_trainer.runner import Runner


def _modules(runner: Runner) -> list[nn.Module]:
    """The model chunks without their DDP wrapper (parameter names as in the model)."""
    return [p.module if isinstance(p, DistributedDataParallel) else p for p in runner.parts]


class UserHooks:
    """Set up once per process after the runner is built; every rank makes the same calls."""

    def __init__(self, job: JobDocument, hf: HFModel | None, mesh: Mesh, runner: Runner) -> None:
        self.job, self.hf, self.mesh, self.runner = job, hf, mesh, runner
        self.evals: list[dict[str, Any]] = []
        """{"step", "loss"} of each validation so far (restored ones included)."""
        training, shape = job.spec.training, job.plan.model
        self.tied: list[Any] = []
        self.duplicates: list[Any] = []
        self.group = None
        if shape.tie_embeddings and job.plan.layout.pp > 1:
            self.group = embedding_group(mesh)
            self.tied = tied_parameters(_modules(runner))
            self.duplicates = [] if runner.is_first else self.tied
        self.schedulers: list[LambdaLR] = [
            make_scheduler(opt, training.lr_schedule, training.steps) for opt in runner.optimizers
        ]
        self.stream: TokenStream
        self.validation: np.ndarray | None = None
        data = training.data
        if data is None:
            self.stream = make_stream(
                job.spec.dataset,
                shape.vocab,
                shape.seq_len,
                training.global_batch_size,
                training.seed,
            )
            return
        folder = hf.path if hf is not None else None
        args = (folder, shape.vocab, shape.seq_len)
        self.stream = open_training(data, *args, training.global_batch_size, training.seed)
        if data.validation is not None:
            self.validation = open_validation(data, *args)

    def after_backward(self) -> None:
        sync_tied_gradients(self.tied, self.group)

    def after_step(self, step: int) -> float | None:
        """Advance the schedule; validate when due (not after the last step: see finish)."""
        for scheduler in self.schedulers:
            scheduler.step()
        training = self.job.spec.training
        every = training.data.eval_every_steps if training.data else 0
        if every and step % every == 0 and step < training.steps:
            return self.validate(step)
        return None

    def validate(self, step: int) -> float | None:
        if self.validation is None:
            return None
        loss = validation_loss(self.job, self.runner, self.mesh, self.validation)
        self.evals.append({"step": step, "loss": loss})
        return loss

    def state(self, step: int) -> dict[str, Any]:
        """What the checkpoint keeps besides model and optimizer."""
        data = self.stream.state_dict(step) if isinstance(self.stream, WindowStream) else None
        return {
            "data": data,
            "schedulers": [s.state_dict() for s in self.schedulers],
            "evals": list(self.evals),
        }

    def restore(self, step: int, state: dict[str, Any]) -> None:
        if isinstance(self.stream, WindowStream) and state.get("data"):
            position = self.stream.resume_step(state["data"])
            assert position == step, f"data position {position} != checkpoint step {step}"
        for scheduler, saved in zip(self.schedulers, state.get("schedulers", []), strict=False):
            scheduler.load_state_dict(saved)
        self.evals = list(state.get("evals", []))

    def finish(self, step: int) -> None:
        """The last validation (unless already done at this step) and the export; collective."""
        if self.validation is not None and not any(e["step"] == step for e in self.evals):
            self.validate(step)
        target = self.job.spec.training.export
        if target is not None:
            hf = self.hf
            dtype = hf.dtype if hf is not None else "float32"
            source = hf.path if hf is not None else None
            modules = _modules(self.runner)
            export(modules, target.path, self.job.plan.model, source, _storable(dtype))


def _storable(dtype: str) -> str:
    """The export dtype: config.json's, float32 when it names something torch lacks."""
    return dtype if isinstance(getattr(torch, dtype, None), torch.dtype) else "float32"


def weight_source(hf: HFModel | None, shape: ModelShape) -> WeightSource | None:
    """The folder's safetensors when it has weights; None: the seeded random initialisation."""
    if hf is None or not hf.weights:
        return None
    return SafetensorsSource(hf.path, shape)
