"""Which checkpoint directory counts as complete (the resume rule), without launching anything."""

from __future__ import annotations

from pathlib import Path

import pytest
from meshrun_trainer.components.checkpoint import complete_steps, latest_complete, prune, step_dir

pytestmark = pytest.mark.unit


def make(root: Path, name: str, metadata: bool) -> None:
    (root / name).mkdir(parents=True)
    if metadata:
        (root / name / ".metadata").write_bytes(b"dcp")


def test_newest_complete_wins_and_partial_ones_are_ignored(tmp_path: Path) -> None:
    make(tmp_path, "step-00000004", metadata=True)
    make(tmp_path, "step-00000010", metadata=True)
    make(tmp_path, "step-00000012.tmp", metadata=True)  # being written: not yet renamed
    make(tmp_path, "step-00000014", metadata=False)  # no DCP metadata: incomplete copy
    make(tmp_path, "step-16", metadata=True)  # not our naming
    assert latest_complete(tmp_path) == (10, tmp_path / "step-00000010")


@pytest.mark.parametrize("state", ["missing", "empty"])
def test_no_checkpoint_means_a_fresh_start(tmp_path: Path, state: str) -> None:
    root = tmp_path / "ckpt"
    if state == "empty":
        root.mkdir()
    assert latest_complete(root) is None


def test_step_dirs_sort_by_step() -> None:
    assert step_dir("/c", 9).name < step_dir("/c", 10).name
    assert step_dir("/c", 123).name == "step-00000123"


@pytest.mark.parametrize(("keep", "left"), [(2, [8, 10]), (1, [10]), (0, [2, 4, 6, 8, 10])])
def test_prune_keeps_the_newest_complete_ones(tmp_path: Path, keep: int, left: list[int]) -> None:
    for step in (2, 4, 6, 8, 10):
        make(tmp_path, step_dir(tmp_path, step).name, metadata=True)
    make(tmp_path, "step-00000012.tmp", metadata=False)
    prune(tmp_path, keep)
    assert complete_steps(tmp_path) == left
    assert (tmp_path / "step-00000012.tmp").is_dir(), "in-flight writes are not ours to delete"
