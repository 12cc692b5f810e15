"""Which torch mechanism serves each layout, and which pipeline stages each rank holds."""

from __future__ import annotations

import pytest
from meshrun_trainer.distributed.parallel import data_parallel_kind
from meshrun_trainer.distributed.stagemap import stages_of_rank

from meshrun.api.layout import Layout

pytestmark = pytest.mark.unit


def make_layout(dp: int = 1, pp: int = 1, tp: int = 1, zero: int = 0, virtual: int = 1) -> Layout:
    return Layout(
        dp=dp,
        pp=pp,
        tp=tp,
        zero_stage=zero,
        schedule="interleaved-1f1b" if virtual > 1 else "1f1b",
        micro_batches=4,
        virtual_stages=virtual,
        grad_accumulation=1,
        micro_batch_size=1,
    )


@pytest.mark.parametrize(
    ("layout", "kind"),
    [
        (make_layout(), "none"),
        (make_layout(zero=3), "none"),  # ZeRO over one replica shards nothing
        (make_layout(dp=4), "ddp"),
        (make_layout(dp=4, zero=1), "ddp+zero1"),
        (make_layout(dp=4, zero=2), "fsdp-zero2"),
        (make_layout(dp=4, zero=3), "fsdp-zero3"),
        (make_layout(dp=2, tp=2), "hsdp-replicate"),  # DDP cannot wrap DTensor modules
        (make_layout(dp=2, pp=2), "hsdp-replicate"),  # ... nor a pipeline stage
        (make_layout(dp=2, pp=2, zero=1), "fsdp-zero2"),
        (make_layout(dp=2, pp=2, tp=2, zero=3), "fsdp-zero3"),
    ],
)
def test_data_parallel_mechanism(layout: Layout, kind: str) -> None:
    assert data_parallel_kind(layout) == kind


def test_interleaved_ranks_hold_every_pp_th_stage() -> None:
    layout = make_layout(pp=2, virtual=2)
    assert [stages_of_rank(r, layout) for r in range(2)] == [[0, 2], [1, 3]]
    assert stages_of_rank(3, make_layout(pp=4)) == [3]
