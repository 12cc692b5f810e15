"""The rules of a job's own files: where the model comes from (a preset, sizes or a Hugging Face
folder; those rules sit with the reader that checks them, :mod:`meshrun.api.modelsource`), its
data, the learning-rate schedule that walks through that data, and where the metrics go.

Each is also a CEL rule of the CRD (the message word for word), and part of
:data:`meshrun.rules.strategy.ALL_RULES`; :func:`meshrun.rules.strategy.check_spec` runs
:func:`check_files_spec`.
What needs the files themselves (config.json, the weights, the tokenizer, the data) is checked
where they can be read: :mod:`meshrun.files.checks`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrun.api.errors import Rule
from meshrun.api.modelsource import MODEL_RULES

if TYPE_CHECKING:
    from meshrun.api.spec import JobSpec

MODEL, TRAINING = "spec.model", "spec.training"
TEXT_DATA_HF = Rule(
    f"{TRAINING}.data",
    f"{TRAINING}.data in format jsonl, parquet or arrow needs {MODEL}.hf (its tokenizer.json "
    "tokenizes the "
    "text)",
)
TOKENS_TEXT_FIELD = Rule(
    f"{TRAINING}.data.textField",
    f"{TRAINING}.data.textField does not apply to format tokens (token files hold ids, not "
    "documents)",
)
EVAL_VALIDATION = Rule(
    f"{TRAINING}.data.evalEverySteps",
    f"{TRAINING}.data.evalEverySteps needs {TRAINING}.data.validation (the held-out data to "
    "evaluate on)",
)
DATA_DATASET = Rule(
    f"{TRAINING}.data",
    f"{TRAINING}.data and {TRAINING}.dataset exclude each other (dataset names the built-in demo "
    "data)",
)
WARMUP_STEPS = Rule(
    f"{TRAINING}.lrSchedule.warmupSteps",
    f"{TRAINING}.lrSchedule.warmupSteps must not exceed {TRAINING}.steps",
)
METRICS_PATH = Rule(
    f"{TRAINING}.metrics.path",
    f"{TRAINING}.metrics.path needs {TRAINING}.metrics.tensorboard (false writes no event files)",
)
EXPORT_MLP = Rule(
    f"{TRAINING}.export",
    f"{TRAINING}.export writes a Llama-family Hugging Face folder and needs {MODEL}.mlp swiglu",
)
DEFAULT_TEXT_FIELD = "text"
"""The CRD's default textField: the only value a tokens dataset may carry."""

FILE_RULES = (
    *MODEL_RULES,
    TEXT_DATA_HF,
    TOKENS_TEXT_FIELD,
    EVAL_VALIDATION,
    DATA_DATASET,
    WARMUP_STEPS,
    METRICS_PATH,
    EXPORT_MLP,
)
"""The rules of the job's own parts (the model's source among them), all CEL rules of the CRD
too."""


def check_files_spec(spec: JobSpec) -> None:
    """The data's and the schedule's rules (the model's are checked as it is read)."""
    training, data = spec.training, spec.training.data
    if data is not None:
        if training.dataset is not None:
            raise DATA_DATASET.error(f"dataset {training.dataset}")
        check_data_source(data.format, data.text_field, spec.model.hf is not None)
        if data.eval_every_steps and data.validation is None:
            raise EVAL_VALIDATION.error(f"evalEverySteps {data.eval_every_steps}")
    check_warmup(training.lr_schedule.warmup_steps, training.steps)
    if training.metrics.path is not None and not training.metrics.tensorboard:
        raise METRICS_PATH.error(f"path {training.metrics.path!r} with tensorboard false")
    if training.export is not None and spec.model.mlp != "swiglu":
        raise EXPORT_MLP.error(f"mlp {spec.model.mlp}")


def check_data_source(format: str, text_field: str, has_hf: bool) -> None:
    """Text needs the model folder's tokenizer; token files have no text field."""
    if format != "tokens" and not has_hf:
        raise TEXT_DATA_HF.error(f"format {format}")
    if format == "tokens" and text_field != DEFAULT_TEXT_FIELD:
        raise TOKENS_TEXT_FIELD.error(f"got {text_field!r}")


def check_warmup(warmup_steps: int, steps: int) -> None:
    if warmup_steps > steps:
        raise WARMUP_STEPS.error(f"{warmup_steps} > {steps}")
