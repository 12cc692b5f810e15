"""Reading a spec and planning it never touch the filesystem; reading a job's files is its own,
bounded step (meshrun.files): regular files only, never past a cap, never a kernel file."""

from __future__ import annotations

import builtins
import contextlib
import io
import os
import pathlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from meshrun_operator.lifecycle.evaluation import evaluate
from meshrun_trainer.local.examplefiles import write_example

from meshrun.api.crd import crd
from meshrun.api.errors import SpecError
from meshrun.api.read import read_spec
from meshrun.api.spec import Data
from meshrun.files.bounded import read_bounded
from meshrun.files.checks import mount, plan_checked
from meshrun.files.data import check_data_files
from meshrun.files.hf import load_hf_model
from meshrun.planner.plan import plan_job

pytestmark = pytest.mark.unit

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))


def example_jobs() -> list[dict[str, Any]]:
    return [job for path in EXAMPLES for job in yaml.safe_load_all(path.read_text()) if job]


class FileAccess(AssertionError):
    """Raised by every file operation while files are blocked."""


@contextlib.contextmanager
def files_blocked() -> Iterator[list[str]]:
    """Every way into the filesystem raises (and is recorded) inside the block; an error inside
    is re-raised once files are back (pytest's own report reads them)."""
    crd()  # the CRD is the package's own file, loaded once beforehand
    touched: list[str] = []

    def refuse(name: str) -> Any:
        def blocked(*args: Any, **kwargs: Any) -> Any:
            touched.append(f"{name}{args[:1]}")
            raise FileAccess(f"{name}{args[:1]} while files are blocked")

        return blocked

    failure: BaseException | None = None
    with pytest.MonkeyPatch.context() as patch:
        for module, names in (
            (builtins, ("open",)),
            (io, ("open", "open_code")),
            (os, ("open", "stat", "lstat", "listdir", "scandir", "access", "fdopen")),
            (pathlib.Path, ("open", "read_text", "read_bytes", "stat", "exists", "is_dir")),
            (pathlib.Path, ("is_file", "glob", "iterdir")),
        ):
            for name in names:
                patch.setattr(module, name, refuse(name))
        try:
            yield touched
        except BaseException as error:
            failure = error
    if failure is not None:
        raise failure


def test_the_planner_and_the_reader_run_with_files_blocked() -> None:
    jobs = example_jobs()
    assert len(jobs) >= len(EXAMPLES)
    hf = next(job["spec"] for job in jobs if "hf" in job["spec"]["model"])
    with files_blocked() as touched:
        for job in jobs:
            spec = job["spec"]
            plan = plan_job(read_spec(spec), job["metadata"]["name"])
            assert plan.world_size == spec["resources"]["numNodes"] * plan.num_proc_per_node
            evaluation = evaluate(spec, job["metadata"]["name"])  # the operator's evaluation
            assert evaluation.plan is not None, evaluation.error
        shape = read_spec(hf).shape
    assert shape.vocab == hf["model"]["vocab"]  # the sizes beside hf
    assert touched == []


def test_the_block_catches_a_read() -> None:
    with pytest.raises(FileAccess), files_blocked() as touched:
        plan_checked(next(job["spec"] for job in example_jobs() if "hf" in job["spec"]["model"]))
    assert touched, "meshrun.files looks for the folder: the block sees it"


def test_a_visible_folder_is_read_only_by_the_files_step(tmp_path: Path) -> None:
    write_example(tmp_path)
    job = next(job for job in example_jobs() if "hf" in job["spec"]["model"])
    spec = mount(job["spec"], [f"/{part}={tmp_path / part}" for part in ("models", "data", "out")])
    assert read_spec(spec).shape.norm_eps == 1e-5  # the sizes beside hf, Llama's defaults
    plan = plan_checked(spec, "hf")
    assert plan.model.norm_eps == 1e-6, "config.json's own architecture, read by meshrun.files"
    assert "LlamaForCausalLM from" in plan.explanation


@pytest.mark.parametrize("path", ["/proc/self/pagemap", "/dev/zero", "/proc/self/environ"])
def test_kernel_files_are_refused_without_reading(path: str) -> None:
    started = time.monotonic()
    with pytest.raises(SpecError, match="kernel file") as caught:
        read_bounded(path, "spec.training.data.path")
    assert caught.value.field == "spec.training.data.path"
    with pytest.raises(SpecError) as data:
        check_data_files(
            Data(format="jsonl", path=path, text_field="t", validation=None, eval_every_steps=0)
        )
    assert data.value.field == "spec.training.data.path"
    assert time.monotonic() - started < 1


def test_fifos_directories_and_big_files_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(SpecError, match="not a regular file"):
        read_bounded(fifo, "f")  # opened without blocking, refused before any read
    with pytest.raises(SpecError, match="a directory"):
        read_bounded(tmp_path, "f")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 2048)
    with pytest.raises(SpecError, match="more than the 1024"):
        read_bounded(big, "f", cap=1024)
    assert read_bounded(big, "f", cap=4096) == b" " * 2048
    folder = tmp_path / "model"
    folder.mkdir()
    os.mkfifo(folder / "config.json")
    with pytest.raises(SpecError) as caught:
        load_hf_model(folder, 64)
    assert caught.value.field == "spec.model.hf.path" and "not a regular file" in caught.value.rule
    with pytest.raises(SpecError, match="not a directory"):
        load_hf_model("/proc/self", 64)
