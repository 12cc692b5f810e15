"""The CRD's CEL rules, checked in Python with the same messages.

The API server enforces ``x-kubernetes-validations``; ``meshrun plan`` runs without a cluster, so
each rule is restated here (tests/unit/test_api_crd.py checks every message below appears in
the CRD, so the two cannot drift apart silently).
"""

from __future__ import annotations

from meshrun.errors import SpecError
from meshrun.planner.spec import JobSpec

# (field the error names, message exactly as in the CRD)
AUTO_DEGREES = (
    "spec.strategy.type",
    "spec.strategy.type auto chooses dataParallel, pipelineParallel, tensorParallel and "
    "zeroStage itself; leave them unset or pick a type",
)
DATA_PARALLEL_ONLY = (
    "spec.strategy.type",
    "spec.strategy.pipelineParallel and spec.strategy.tensorParallel must be 1 (or unset) when "
    "spec.strategy.type is ddp or zero",
)
DDP_ZERO = (
    "spec.strategy.zeroStage",
    "spec.strategy.zeroStage must be 0 when spec.strategy.type is ddp (use type zero to shard)",
)
ZERO_STAGE = (
    "spec.strategy.zeroStage",
    "spec.strategy.zeroStage must be 1, 2 or 3 when spec.strategy.type is zero",
)
PIPELINE_TP = (
    "spec.strategy.tensorParallel",
    "spec.strategy.tensorParallel must be 1 (or unset) when spec.strategy.type is pipeline "
    "(use hybrid)",
)
TENSOR_PP = (
    "spec.strategy.pipelineParallel",
    "spec.strategy.pipelineParallel must be 1 (or unset) when spec.strategy.type is tensor "
    "(use hybrid)",
)
VIRTUAL_STAGES = (
    "spec.strategy.virtualStages",
    "spec.strategy.virtualStages above 1 needs spec.strategy.pipelineSchedule interleaved-1f1b",
)
BATCH = (
    "spec.training.globalBatchSize",
    "spec.training.globalBatchSize must be a multiple of spec.training.microBatchSize",
)
ALL_RULES = (
    AUTO_DEGREES,
    DATA_PARALLEL_ONLY,
    DDP_ZERO,
    ZERO_STAGE,
    PIPELINE_TP,
    TENSOR_PP,
    VIRTUAL_STAGES,
    BATCH,
)


def _fail(rule: tuple[str, str]) -> SpecError:
    return SpecError(*rule)


def check_rules(job: JobSpec) -> None:
    """Raise SpecError for the first CEL rule of the CRD that ``job`` breaks."""
    s, t = job.strategy, job.training
    unset_or_one = (None, 1)
    if s.type == "auto" and (
        s.dp is not None or s.pp is not None or s.tp is not None or s.zero_stage is not None
    ):
        raise _fail(AUTO_DEGREES)
    if s.type in ("ddp", "zero") and (s.pp not in unset_or_one or s.tp not in unset_or_one):
        raise _fail(DATA_PARALLEL_ONLY)
    if s.type == "ddp" and s.zero_stage not in (None, 0):
        raise _fail(DDP_ZERO)
    if s.type == "zero" and not s.zero_stage:
        raise _fail(ZERO_STAGE)
    if s.type == "pipeline" and s.tp not in unset_or_one:
        raise _fail(PIPELINE_TP)
    if s.type == "tensor" and s.pp not in unset_or_one:
        raise _fail(TENSOR_PP)
    if s.virtual_stages not in unset_or_one and s.schedule != "interleaved-1f1b":
        raise _fail(VIRTUAL_STAGES)
    if t.global_batch % t.micro_batch:
        raise _fail(BATCH)
    if t.dataset == "corpus" and job.model.vocab < 256:
        raise SpecError(
            "spec.training.dataset",
            f"corpus is byte-tokenized and needs spec.model.vocab >= 256, got {job.model.vocab}",
        )
    procs = job.resources.proc_per_node
    if s.tp is not None and procs % s.tp:
        # The CRD's spec-level rule; here with the numbers filled in.
        raise SpecError(
            "spec.strategy.tensorParallel",
            f"{s.tp} must divide spec.resources.numProcPerNode={procs} (a tensor-parallel group "
            "stays inside one pod)",
        )
