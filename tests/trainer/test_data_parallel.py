"""What each data-parallel mechanism means for the gradients: DDP's buckets, FSDP2, and whether
whole gradients are all-reduced once per optimizer step (gradient accumulation skips the others'
sync only then)."""

from __future__ import annotations

import pytest
from meshrun_trainer.distributed.parallel import (
    DataParallel,
    data_parallel_kind,
    gradients_in_buckets,
    uses_fsdp,
)
from test_strategies import make_layout

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("kind", "buckets", "fsdp", "whole"),
    [
        (DataParallel.NONE, False, False, False),
        (DataParallel.DDP, True, False, True),
        (DataParallel.DDP_ZERO1, True, False, True),
        (DataParallel.HSDP_REPLICATE, False, True, True),
        (DataParallel.FSDP_ZERO2, False, True, False),
        (DataParallel.FSDP_ZERO3, False, True, False),
    ],
)
def test_each_mechanism_says_how_its_gradients_are_held(
    kind: DataParallel, buckets: bool, fsdp: bool, whole: bool
) -> None:
    assert (kind.buckets, kind.fsdp, kind.replicates_gradients) == (buckets, fsdp, whole)


def test_the_layouts_mechanism_is_a_member_and_the_helpers_read_it() -> None:
    hybrid = make_layout(dp=2, tp=2)
    assert data_parallel_kind(hybrid) is DataParallel.HSDP_REPLICATE
    assert uses_fsdp(hybrid) and not gradients_in_buckets(hybrid)
    ddp = make_layout(dp=4, zero=1)
    assert data_parallel_kind(ddp) is DataParallel.DDP_ZERO1
    assert gradients_in_buckets(ddp) and not uses_fsdp(ddp)
    # The summary a pod writes carries the value, as JSON has it.
    assert DataParallel.FSDP_ZERO3.value == "fsdp-zero3"
