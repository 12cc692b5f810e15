"""examples/hf-finetune.yaml as a user runs it: `meshrun example-files`, then `meshrun run --local`
with --mount, on CPU, a few steps; the export is a complete Hugging Face folder. Bad input stops
before any process starts, naming the field."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from trainer_launch import REPO, cpu_env

from meshrun.files.hf import load_hf_model

pytestmark = pytest.mark.trainer

EXAMPLE = REPO / "examples" / "hf-finetune.yaml"
STEPS = 6


def meshrun(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "meshrun", *args],
        cwd=REPO,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_file(tmp: Path, **training: Any) -> Path:
    """The example with fewer steps (and ``training`` changes)."""
    job = yaml.safe_load(EXAMPLE.read_text())
    job["spec"]["training"] |= {"steps": STEPS, **training}
    job["spec"]["training"]["data"]["evalEverySteps"] = 3
    path = tmp / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("example")
    made = meshrun("example-files", str(root))
    assert made.returncode == 0, made.stderr
    command = made.stdout.split()
    assert command[:4] == ["meshrun", "run", "--local", "examples/hf-finetune.yaml"]
    return root, command[4:]


@pytest.mark.timeout(600)
def test_the_example_fine_tunes_and_exports(files: tuple[Path, list[str]], tmp_path: Path) -> None:
    root, mounts = files
    summary = tmp_path / "summary.json"
    run = meshrun("run", "--local", str(job_file(tmp_path)), *mounts, "--quiet",
                  "--summary-json", str(summary))  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(summary.read_text())
    assert len(result["losses"]) == STEPS and result["worldSize"] == 2
    evals = result["eval"]
    assert [e["step"] for e in evals] == [0, 3, STEPS]
    assert evals[-1]["loss"] < evals[0]["loss"] - 0.2, evals
    export = root / "out" / "tiny-llama-finetuned"
    folder = load_hf_model(export, seq_len=64)  # every tensor present with config.json's shape
    assert folder.weights and folder.tokenizer is not None
    assert json.loads((export / "config.json").read_text())["model_type"] == "llama"
    assert not list((root / "out").glob(".*partial")), "no half-written folder left behind"


@pytest.mark.parametrize(
    ("training", "field", "fragment"),
    [
        ({"globalBatchSize": 512}, "spec.training.data.path", "fewer than one global batch"),
        ({"data": {"path": "/data/absent.jsonl"}}, "spec.training.data.path", "does not exist"),
    ],
)
def test_bad_input_stops_before_any_process(
    files: tuple[Path, list[str]],
    tmp_path: Path,
    training: dict[str, Any],
    field: str,
    fragment: str,
) -> None:
    _, mounts = files
    job = yaml.safe_load(job_file(tmp_path).read_text())
    for key, value in training.items():
        current = job["spec"]["training"].get(key)
        job["spec"]["training"][key] = current | value if isinstance(value, dict) else value
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(job))
    run = meshrun("run", "--local", str(tmp_path / "bad.yaml"), *mounts, "--quiet", timeout=120)
    assert run.returncode == 2, run.stderr
    assert field in run.stderr and fragment in run.stderr
    assert "training failed" not in run.stderr, "refused before the processes started"
