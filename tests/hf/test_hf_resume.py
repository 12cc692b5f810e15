"""A fine-tuning run killed mid-way and resumed gives the losses, validation losses and data
order of an uninterrupted run; the data is tokenized once (the cache beside it is reused).

Through the trainer's own entrypoint (torchrun -m meshrun_trainer), 2 processes, Qwen2 (tied
embeddings) in PP 2 with gradient accumulation, JSON Lines data, a warmup + cosine schedule.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hf_check import spec_parts
from hf_factories import corpus_documents, make_hf_folder, validation_documents, write_jsonl
from meshrun_trainer.local.env import layout_env
from trainer_launch import REPO, cpu_env, run, torchrun

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

STEPS = 10


def _env(model: Path, data: Path, checkpoints: Path) -> dict[str, str]:
    job = {"train": str(data / "train.jsonl"), "validation": str(data / "val.jsonl")}
    spec_model, training = spec_parts(str(model), {**job, "steps": STEPS, "evalEvery": 2}, None)
    training["checkpoint"] = {"everySteps": 2}
    # The operator's checkpoint mount (not a spec field): here a folder per run.
    env = layout_env(
        spec_model,
        training,
        pp=2,
        micro_batches=2,
        grad_accumulation=2,
        checkpoint_dir=str(checkpoints),
    )
    return cpu_env(**{**env, "WORLD_SIZE": "2"})


def _events(stdout: str) -> dict[str, Any]:
    events = [json.loads(line) for line in stdout.splitlines() if line.startswith('{"event"')]
    return {
        "losses": {e["step"]: e["loss"] for e in events if e["event"] == "step"},
        "summary": next(e for e in events if e["event"] == "summary"),
    }


def _killed_after(cmd: list[str], env: dict[str, str], step: int) -> None:
    """Start the run and SIGKILL all its processes once step ``step`` is reported."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith('{"event": "step"') and json.loads(line)["step"] == step:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


@pytest.mark.timeout(600)
def test_killed_and_resumed_run_equals_an_uninterrupted_one(tmp_path: Path) -> None:
    model = make_hf_folder(tmp_path / "qwen2", "qwen2", seed=4)
    docs = corpus_documents()
    write_jsonl(tmp_path / "data" / "train.jsonl", docs * 3)
    write_jsonl(tmp_path / "data" / "val.jsonl", validation_documents())
    cmd = torchrun(2, "-m", "meshrun_trainer")

    whole = run(cmd, _env(model, tmp_path / "data", tmp_path / "a"), timeout=300)
    assert whole.returncode == 0, whole.stderr[-4000:]
    assert "tokenized" in whole.stderr  # the first run tokenizes train and validation
    cached = sorted((tmp_path / "data" / ".meshrun-cache").glob("*.u16"))
    assert [p.name.split(".")[0] for p in cached] == ["train", "val"]
    reference = _events(whole.stdout)

    _killed_after(
        torchrun(2, "-m", "meshrun_trainer"), _env(model, tmp_path / "data", tmp_path / "b"), 3
    )
    assert (tmp_path / "b" / "step-00000002" / ".metadata").is_file()
    resumed = run(cmd, _env(model, tmp_path / "data", tmp_path / "b"), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "tokenized" not in resumed.stderr  # the cache is reused
    got = _events(resumed.stdout)
    start = got["summary"]["resumedFromStep"]
    assert 2 <= start < STEPS, "killed after a checkpoint and before the end"
    assert sorted(got["losses"]) == list(range(start + 1, STEPS + 1))
    for step in got["losses"]:
        assert abs(got["losses"][step] - reference["losses"][step]) < 1e-6, (got, reference)
    want = reference["summary"]["eval"]
    assert [e["step"] for e in want] == list(range(0, STEPS + 1, 2))
    assert [e["step"] for e in got["summary"]["eval"]] == [e["step"] for e in want]
    for a, b in zip(got["summary"]["eval"], want, strict=True):
        assert abs(a["loss"] - b["loss"]) < 1e-6
