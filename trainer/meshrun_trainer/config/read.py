"""The trainer's job, read from the job document (``MESHRUN_JOB``, meshrun.jobdoc) the operator
(or the local launcher) sets.

The document holds the defaulted spec, the plan and the pod, read back into the core's own types
by the planner's reader, so the trainer has no schema, defaults or types of its own: it reads
``job.spec.training.steps``, ``job.plan.layout``, ``job.pod.checkpoint_dir``. The rules are the
planner's (:mod:`meshrun.rules`), so a job that ``meshrun plan`` accepts starts without a
configuration error; an error is a SpecError naming the spec field and the rule.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from meshrun.api.errors import SpecError
from meshrun.jobdoc import JOB_VARIABLE, JobDocument, read_document
from meshrun.planner.plan import Plan
from meshrun.rules.files import check_data_source, check_warmup
from meshrun.rules.strategy import check_data, check_layout, check_model


def read_job(env: Mapping[str, str] | None = None) -> JobDocument:
    """Read the job document from ``env`` (default: ``os.environ``) and check it with the
    planner's rules; a broken one is a SpecError naming the spec field."""
    env = os.environ if env is None else env
    text = env.get(JOB_VARIABLE)
    if not text:
        raise SpecError(
            JOB_VARIABLE, "is required but not set (meshrun.envcontract.pod_env sets it)"
        )
    world = env.get("WORLD_SIZE")  # set by torchrun for every process
    job = read_document(text)
    spec, plan = job.spec, job.plan
    training = spec.training
    check_model(plan.model)
    check_layout(
        plan.layout,
        plan.model,
        global_batch_size=training.global_batch_size,
        world_size=int(world) if world and world.isdigit() else None,
    )
    if training.data is None:
        check_data(spec.dataset, plan.model)
    else:
        check_data_source(training.data.format, training.data.text_field, spec.model.hf is not None)
    check_warmup(training.lr_schedule.warmup_steps, training.steps)
    check_stage_layers(plan)
    return job


def check_stage_layers(plan: Plan) -> None:
    """The plan's stage ranges: one per stage, contiguous, covering the model."""
    field, ranges, stages = "plan.stages", plan.stage_layers, plan.layout.num_stages
    if len(ranges) != stages:
        raise SpecError(
            field, f"needs pp x virtualStages = {stages} ranges in stage order, got {len(ranges)}"
        )
    expected = 0
    for first, last in ranges:
        if first != expected or last < first:
            raise SpecError(field, "ranges must be contiguous, non-empty and start at 0")
        expected = last + 1
    if expected != plan.model.layers:
        raise SpecError(field, f"ranges must cover all {plan.model.layers} layers")
