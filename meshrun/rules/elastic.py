"""The rules of ``spec.elastic``: which data-parallel degrees an elastic job may run at.

An elastic job keeps its tensor and pipeline layout and its global batch at every size, so a
degree is allowed when it splits the global batch into whole micro-batches per replica. The
API server checks the bounds (CEL on ``spec``, with the same messages); the planned degree is
known only after planning, so :func:`check_elastic` runs again with it.
"""

from __future__ import annotations

from meshrun.api.errors import Rule
from meshrun.api.layout import Layout
from meshrun.api.spec import JobSpec

ELASTIC = "spec.elastic"
MIN_PLANNED = Rule(
    f"{ELASTIC}.minDataParallel",
    f"{ELASTIC}.minDataParallel must not exceed the planned data-parallel degree "
    "(spec.strategy.dataParallel, at most spec.resources.numNodes x numProcPerNode)",
)
BOUNDS_BATCH = Rule(
    ELASTIC,
    f"{ELASTIC}.minDataParallel and maxDataParallel must divide spec.training.globalBatchSize / "
    "spec.training.microBatchSize (every allowed data-parallel degree keeps the global batch)",
)
MAX_MIN = Rule(
    f"{ELASTIC}.maxDataParallel",
    f"{ELASTIC}.maxDataParallel must not be below {ELASTIC}.minDataParallel",
)
ELASTIC_RULES = (MIN_PLANNED, BOUNDS_BATCH, MAX_MIN)


def check_elastic(spec: JobSpec, planned: Layout | None = None) -> None:
    """The CEL rules restated (an unset microBatchSize counts as 1, as there); with the
    ``planned`` layout, the minimum against its degree and the bounds against its micro-batch
    size (auto's choice where the spec leaves it unset)."""
    elastic = spec.elastic
    if elastic is None:
        return
    low, high = elastic.min_data_parallel, elastic.max_data_parallel
    if high is not None and high < low:
        raise MAX_MIN.error(f"{high} < {low}")
    bound = spec.strategy.data_parallel or spec.resources.world_size
    micro_batch_size = spec.training.micro_batch_size or 1
    if planned is not None:
        bound, micro_batch_size = planned.dp, planned.micro_batch_size
    if low > bound:
        raise MIN_PLANNED.error(f"{low} > {bound}")
    passes = spec.training.global_batch_size // micro_batch_size
    for degree in (low, high):
        if degree is not None and passes % degree:
            raise BOUNDS_BATCH.error(f"{degree} does not divide {passes}")
