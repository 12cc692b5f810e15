"""What a trainer process imports before it knows its layout: the parts a layout may not use are
imported where they are used, since every rank of every job pays for an import (a rank's start
is seconds of CPU, most of it torch's)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit

ON_DEMAND = (
    "torch.distributed.optim",  # ZeRO-1's optimizer: TorchScript compiles at import
    "torch.distributed.pipelining",  # pipeline layouts only
    "tokenizers",  # a job with a tokenizer only
)


def test_the_trainers_entrypoint_imports_what_some_layouts_need_only_on_demand() -> None:
    probe = (
        f"import sys, meshrun_trainer.main\nprint([m for m in {ON_DEMAND!r} if m in sys.modules])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip() == "[]", proc.stdout
