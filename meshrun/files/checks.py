"""The files a job reads, checked before any process starts, and the plan that names them.

A job's Hugging Face folder, data and export folder are container paths in pods (volumes through
``podTemplate``) and local paths for ``meshrun run --local``. Whatever is visible on this
machine is checked here, with errors naming the field: config.json and the weights' shapes, the
data files and their text field, the tokenizer's vocabulary against the model's, and a dataset
too small for one global batch. Where they are not visible (the operator, which does not mount
the job's volumes, or ``meshrun plan`` on a laptop), the plan says so in its warnings and the
trainer makes the same checks first thing in its pod (a permanent error, exit code 2).

``--mount CONTAINER=LOCAL`` (``meshrun plan`` and ``meshrun run --local``) maps container paths
to local ones, so a job written for a cluster runs unchanged on this machine.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from meshrun.api.crd import check_job
from meshrun.api.errors import SpecError
from meshrun.api.presets import ModelShape
from meshrun.api.read import defaulted, read_section, read_spec
from meshrun.api.spec import Data, JobSpec, Model
from meshrun.files.bounded import in_kernel_filesystem
from meshrun.files.data import check_data_files, check_dataset_size, check_tokenizer, known_tokens
from meshrun.files.hf import (
    FIELD,
    SUPPORTED,
    HFModel,
    load_hf_model,
    read_config,
    shape_from_config,
)
from meshrun.files.mountflag import parse_mount
from meshrun.planner.explain import parameter_text
from meshrun.planner.plan import Plan, plan_job

TokenCounter = Callable[[Data, str, HFModel | None, int], int]
"""(data, path, model folder, vocab) -> tokens in the dataset, tokenizing it if need be."""

PATH_FIELDS = (
    ("model", "hf", "path"),
    ("training", "data", "path"),
    ("training", "data", "validation", "path"),
    ("training", "export", "path"),
    ("training", "metrics", "path"),
)
"""The spec's container paths, as key paths into the spec."""


def mount(spec: Mapping[str, Any], mounts: Sequence[str]) -> dict[str, Any]:
    """A copy of ``spec`` with each path under a ``CONTAINER=LOCAL`` mount moved to LOCAL
    (the longest matching container path wins)."""
    pairs: list[tuple[str, str]] = []
    for item in mounts:
        try:
            container, local = parse_mount(item)
        except ValueError as error:
            raise SpecError("--mount", str(error)) from None
        pairs.append((container.rstrip("/") or "/", str(Path(local).resolve())))
    pairs.sort(key=lambda pair: len(pair[0]), reverse=True)
    result = copy.deepcopy(dict(spec))
    for keys in PATH_FIELDS:
        parent = result
        for key in keys[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None  # type: ignore[assignment]
        if not isinstance(parent, dict) or not isinstance(parent.get(keys[-1]), str):
            continue
        path = parent[keys[-1]]
        for container, local in pairs:
            if path == container or path.startswith(container.rstrip("/") + "/"):
                parent[keys[-1]] = local + path[len(container.rstrip("/")) :]
                break
    return result


def visible_folder(path: str) -> bool:
    """A model folder on this machine (never one in the kernel's filesystems)."""
    return not in_kernel_filesystem(path) and Path(path).is_dir()


def folder_shape(model: Model) -> ModelShape | None:
    """The shape ``spec.model.hf``'s config.json gives, when the folder is visible here."""
    hf = model.hf
    if hf is None or model.seq_len is None or model.preset is not None:
        return None  # the reader refuses these with the rule's own message
    if not visible_folder(hf.path):
        return None
    return shape_from_config(read_config(hf.path), model.seq_len)


def read_with_files(spec: Mapping[str, Any] | JobSpec) -> JobSpec:
    """:func:`meshrun.api.read.read_spec`, with the model's shape from its folder's config.json
    where the folder is visible here (the reader itself never opens a file)."""
    if isinstance(spec, JobSpec):
        return spec
    model = read_section(Model, defaulted(spec)["model"])
    return read_spec(spec, folder_shape=folder_shape(model))


def check_files(
    spec: JobSpec, *, local: bool = False, count_tokens: TokenCounter | None = None
) -> tuple[HFModel | None, list[str]]:
    """Check the files of ``spec`` visible here; return the model folder read (or None) and
    notes on what could not be checked.

    ``local``: the paths are this machine's (``meshrun run --local``), so a missing one is an
    error. Otherwise the job's paths count as this machine's when its model folder (or its data)
    is here. ``count_tokens`` tokenizes a text dataset whose size is not known yet.
    """
    hf, notes = spec.model.hf, []
    model = None
    if hf is not None:
        if visible_folder(hf.path):
            model = load_hf_model(hf.path, spec.shape.seq_len)
        elif local:
            raise SpecError(FIELD, f"{hf.path} does not exist")
        else:
            notes.append(
                f"{FIELD} {hf.path} is not visible here: planned from the sizes given beside "
                "it; the trainer checks config.json, the weights and the tokenizer first thing."
            )
    data = spec.training.data
    if data is None:
        return model, notes
    if not (local or model is not None or Path(data.path).exists()):
        notes.append(
            f"spec.training.data.path {data.path} is not visible here: the trainer checks the "
            "data first thing."
        )
        return model, notes
    check_data_files(data)
    tokenizer = model.tokenizer if model is not None else None
    if data.format != "tokens":
        if model is None:
            notes.append("The tokenizer is checked by the trainer (the model folder is not here).")
            return model, notes
        check_tokenizer(tokenizer, model.shape.vocab, FIELD)
    sets = [("spec.training.data.path", data.path, spec.training.global_batch_size)]
    if data.validation is not None:
        sets.append(("spec.training.data.validation.path", data.validation.path, 1))
    for field, path, batch in sets:
        tokens = known_tokens(data, path, tokenizer, spec.shape.vocab)
        if tokens is None and count_tokens is not None:
            tokens = count_tokens(data, path, model, spec.shape.vocab)
        if tokens is None:
            notes.append(
                f"{field}: its size is checked once it is tokenized (meshrun prepare-data, or "
                "the first start)."
            )
            continue
        check_dataset_size(tokens, spec.shape.seq_len, batch, field)
    return model, notes


def model_sentence(spec: JobSpec, model: HFModel | None) -> str | None:
    """What the plan's model is, for a job with ``spec.model.hf``."""
    if spec.model.hf is None:
        return None
    if model is None:
        return (
            "The model's sizes are those given beside spec.model.hf (its config.json is not "
            "visible here): the parameter count assumes an untied output head and no biases."
        )
    count, arch = model.shape.parameters(), model.shape.architecture
    tied = ", the tied embedding counted once" if model.shape.tie_embeddings else ""
    return (
        f"The model is {SUPPORTED.get(arch, f'{arch} (mlp gelu, random weights)')} from "
        f"{model.path / 'config.json'}: "
        f"{parameter_text(count)} parameters ({count:,} exactly{tied})."
    )


def plan_checked(
    raw_spec: Mapping[str, Any] | JobSpec,
    name: str = "job",
    *,
    local: bool = False,
    count_tokens: TokenCounter | None = None,
) -> Plan:
    """:func:`meshrun.planner.plan.plan_job`, then :func:`check_files`: its notes join the plan's
    warnings and the model's origin its explanation. SpecError names the field at fault."""
    spec = read_with_files(raw_spec)
    plan = plan_job(spec, name)
    model, notes = check_files(spec, local=local, count_tokens=count_tokens)
    sentence = model_sentence(spec, model)
    explanation = f"{sentence} {plan.explanation}" if sentence else plan.explanation
    return dataclasses.replace(plan, explanation=explanation, warnings=[*plan.warnings, *notes])


def plan_document(
    document: Any, where: str, mounts: Sequence[str] = ()
) -> tuple[dict[str, Any], JobSpec, Plan]:
    """One YAML document as ``meshrun plan`` reads it: checked as a ParallelTrainingJob (the
    CRD's schema), its spec read with the files under ``mounts`` visible here, and planned;
    returns the job unchanged, its spec and its plan. SpecError names the field at fault
    (``where``: the document, in its message)."""
    job = check_job(document, where)
    spec = read_spec(mount(job["spec"], mounts))
    return job, spec, plan_checked(spec, job["metadata"]["name"])
