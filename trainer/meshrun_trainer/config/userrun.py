"""What a job trains on and where the result goes: a Hugging Face model folder, its own data,
the optimizer and learning-rate schedule, and the export folder, as the configuration names them
(meshrun_trainer.config, docs/env-contract.md). The files are checked first thing, before any
collective, with errors naming the spec field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from meshrun.api.userspec import Data, LRSchedule
from meshrun.files.data import check_data_files, check_tokenizer
from meshrun.files.hf import FIELD, HFModel, load_hf_model
from meshrun.rules.inputs import HF_SIZES, TEXT_DATA_HF, check_sizes
from meshrun_trainer.config.read import TrainConfig


@dataclass(frozen=True, kw_only=True)
class UserRun:
    """The job's own model folder, data, schedule and export."""

    hf: HFModel | None
    """The Hugging Face folder the model comes from (shape, weights, tokenizer), or None."""
    data: Data | None
    """Text or token data; None trains on the synthetic stream or the shipped corpus."""
    export: Path | None
    """Write the trained model here as a Hugging Face folder at the end, or None."""
    lr_schedule: LRSchedule
    """Warmup and decay."""


def from_env(cfg: TrainConfig) -> UserRun:
    """Read and check the job's own parts named by ``cfg``; SpecError names the field at fault."""
    hf = load_hf_model(cfg.hf_path, cfg.model.seq_len) if cfg.hf_path else None
    data = cfg.training.data
    if data is not None:
        check_data_files(data)
        if data.format != "tokens":
            if hf is None:
                raise TEXT_DATA_HF.error(f"format {data.format}")
            check_tokenizer(hf.tokenizer, hf.shape.vocab, FIELD)
    training = cfg.training
    return UserRun(
        hf=hf,
        data=data,
        export=Path(training.export_path) if training.export_path else None,
        lr_schedule=training.lr_schedule,
    )


def with_model(cfg: TrainConfig, run: UserRun) -> TrainConfig:
    """The configuration with the Hugging Face folder's architecture; the planned sizes must be
    config.json's (they are, unless the job was planned from sizes given beside hf)."""
    if run.hf is None:
        return cfg
    check_sizes(run.hf.shape, {name: getattr(cfg.model, name) for name in HF_SIZES})
    return dataclasses.replace(cfg, model=run.hf.shape)
