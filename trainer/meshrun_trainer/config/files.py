"""The job's own files as the trainer opens them: the Hugging Face model folder and the data the
spec names (``spec.model.hf``, ``spec.training.data``), checked first thing, before any
collective, with errors naming the spec field. The optimizer, schedule and export are read from
``job.spec.training`` where they are used."""

from __future__ import annotations

import dataclasses

from meshrun.api.modelsource import HF_SIZES, check_mlp, check_sizes
from meshrun.files.data import check_data_files, check_tokenizer
from meshrun.files.hf import FIELD, HFModel, load_hf_model
from meshrun.jobdoc import JobDocument
from meshrun.rules.files import TEXT_DATA_HF


def open_files(job: JobDocument) -> HFModel | None:
    """Check the job's data and open its Hugging Face folder (None when the spec names none);
    SpecError names the field at fault."""
    hf_spec = job.spec.model.hf
    hf = load_hf_model(hf_spec.path, job.plan.model.seq_len) if hf_spec is not None else None
    data = job.spec.training.data
    if data is not None:
        check_data_files(data)
        if data.format != "tokens":
            if hf is None:
                raise TEXT_DATA_HF.error(f"format {data.format}")
            check_tokenizer(hf.tokenizer, hf.shape.vocab, FIELD)
    return hf


def with_model(job: JobDocument, hf: HFModel | None) -> JobDocument:
    """The job with the Hugging Face folder's architecture as its model; the planned sizes must
    be config.json's (they are, unless the job was planned from sizes given beside hf)."""
    if hf is None:
        return job
    check_sizes(hf.shape, {name: getattr(job.plan.model, name) for name in HF_SIZES})
    check_mlp(hf.shape, job.plan.model.mlp)
    spec = dataclasses.replace(job.spec, shape=hf.shape)
    return dataclasses.replace(job, spec=spec, plan=dataclasses.replace(job.plan, model=hf.shape))
