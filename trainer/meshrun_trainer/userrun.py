"""What a job trains on and where the result goes: a Hugging Face model folder, its own data,
the optimizer and learning-rate schedule, and the export folder, read from the environment
(docs/env-contract.md). Checked before training, with errors naming the spec field."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from meshrun.errors import SpecError
from meshrun.hf import HFModel, load_hf_model
from meshrun.userdata import DataSpec, check_data_files, check_tokenizer, data_spec
from meshrun_trainer.config import TrainConfig
from meshrun_trainer.optim import ADAMW_BETAS, WEIGHT_DECAY, LRSchedule, OptimizerSettings


@dataclass(frozen=True, kw_only=True)
class UserRun:
    """The job's own model, data, optimizer and export; every part optional."""

    hf: HFModel | None = None
    """The Hugging Face folder the model comes from (shape, weights, tokenizer)."""
    data: DataSpec | None = None
    """Text or token data; None trains on the synthetic stream or the shipped corpus."""
    export: Path | None = None
    """Write the trained model here as a Hugging Face folder at the end."""
    optimizer: OptimizerSettings | None = None
    """AdamW settings; None takes the learning rate of the training config and the defaults."""
    lr_schedule: LRSchedule = field(default_factory=LRSchedule)
    """Warmup and decay."""


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name) or str(default)
    try:
        return float(raw)
    except ValueError:
        raise SpecError(name, f"must be a number, got {raw!r}") from None


def from_env(cfg: TrainConfig, env: Mapping[str, str] | None = None) -> UserRun:
    """Read and check the job's own parts; SpecError names the field at fault."""
    env = os.environ if env is None else env
    hf = (
        load_hf_model(env["MESHRUN_HF_PATH"], cfg.model.seq_len)
        if env.get("MESHRUN_HF_PATH")
        else None
    )
    data = None
    if env.get("MESHRUN_DATA_PATH"):
        validation = env.get("MESHRUN_DATA_VALIDATION_PATH")
        data = data_spec(
            {
                "format": env.get("MESHRUN_DATA_FORMAT", "jsonl"),
                "path": env["MESHRUN_DATA_PATH"],
                "textField": env.get("MESHRUN_DATA_TEXT_FIELD", "text"),
                "validation": {"path": validation} if validation else None,
                "evalEverySteps": int(env.get("MESHRUN_EVAL_EVERY_STEPS", "0")),
            }
        )
        check_data_files(data)
        if data.format != "tokens":
            if hf is None:
                raise SpecError(
                    "spec.training.data", "text data needs spec.model.hf (its tokenizer)"
                )
            check_tokenizer(hf.tokenizer, hf.shape.vocab, "spec.model.hf.path")
    betas = (
        tuple(float(b) for b in env.get("MESHRUN_ADAM_BETAS", "").split(",") if b) or ADAMW_BETAS
    )
    if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
        raise SpecError(
            "spec.training.optimizer.betas", f"needs two numbers in [0, 1), got {betas}"
        )
    optimizer = OptimizerSettings(
        learning_rate=cfg.training.learning_rate,
        betas=(betas[0], betas[1]),
        weight_decay=_float(env, "MESHRUN_WEIGHT_DECAY", WEIGHT_DECAY),
    )
    schedule = LRSchedule(
        decay=env.get("MESHRUN_LR_DECAY", "constant"),  # type: ignore[arg-type]
        warmup_steps=int(env.get("MESHRUN_WARMUP_STEPS", "0")),
        min_ratio=_float(env, "MESHRUN_MIN_LR_RATIO", 0.0),
    )
    if schedule.decay not in ("constant", "cosine", "linear"):
        raise SpecError("spec.training.lrSchedule.decay", "must be constant, cosine or linear")
    export = Path(env["MESHRUN_EXPORT_PATH"]) if env.get("MESHRUN_EXPORT_PATH") else None
    return UserRun(hf=hf, data=data, export=export, optimizer=optimizer, lr_schedule=schedule)


def with_model(cfg: TrainConfig, run: UserRun) -> TrainConfig:
    """The configuration with the Hugging Face folder's architecture (its sizes must agree)."""
    if run.hf is None:
        return cfg
    shape = run.hf.shape
    for name in ("layers", "hidden", "heads", "kv_heads", "vocab", "ffn_hidden", "seq_len"):
        if getattr(shape, name) != getattr(cfg.model, name):
            raise SpecError(
                "spec.model.hf.path",
                f"config.json gives {name}={getattr(shape, name)}, "
                f"the plan {getattr(cfg.model, name)}",
            )
    return dataclasses.replace(cfg, model=shape)
