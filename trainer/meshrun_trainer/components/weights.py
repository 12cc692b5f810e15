"""A job's weights in and out: the initial ones from the Hugging Face folder's safetensors
(``spec.model.hf``), and the trained ones exported to a Hugging Face folder
(``spec.training.export``) once the last step is done."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from meshrun_trainer.models.hf import SafetensorsSource, export

if TYPE_CHECKING:
    from meshrun.api.presets import ModelShape
    from meshrun.files.hf import HFModel
    from meshrun.jobdoc import JobDocument
    from meshrun_trainer.models.materialize import WeightSource
    from meshrun_trainer.runner import Runner


def weight_source(hf: HFModel | None, shape: ModelShape) -> WeightSource | None:
    """The folder's safetensors when it has weights; None: the seeded random initialisation."""
    if hf is None or not hf.weights:
        return None
    return SafetensorsSource(hf.path, shape)


def export_weights(job: JobDocument, hf: HFModel | None, runner: Runner) -> None:
    """Write the trained model to ``spec.training.export`` (nothing when unset); collective."""
    target = job.spec.training.export
    if target is None:
        return
    dtype = hf.dtype if hf is not None else "float32"
    source = hf.path if hf is not None else None
    export(runner.modules(), target.path, job.plan.model, source, _storable(dtype))


def _storable(dtype: str) -> str:
    """The export dtype: config.json's, float32 when it names something torch lacks."""
    return dtype if isinstance(getattr(torch, dtype, None), torch.dtype) else "float32"
