"""Tiny Llama (Llama 3 RoPE scaling, grouped-query attention) and Qwen2 (tied embeddings, q/k/v
bias) models from transformers fine-tuned on JSON Lines with each sequence split over 2 ranks
(context parallelism) train as without it.

A launch of 2 ranks trains each folder at cp 2 and at cp 1 (dp 2, which the other
Hugging Face tests hold to one process), one of 4 ranks at pp 2 x cp 2 (the validation loss
summed from the pipeline's per-micro-batch losses; Qwen2's tied head on the last stage keeps
its gradient equal to the embedding's on the first, pairwise at each cp rank): step 0's
validation loss under cp equals
the one transformers computes (within 1e-5), so the split windows, the global positions of the
rotary embedding and the gathered attention agree with the model's own; every step's training
loss and every validation loss under cp equal cp 1's within 1e-5.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hf_factories import corpus_documents, make_hf_folder, validation_documents, write_jsonl
from test_hf_layouts import rule_loss
from trainer_launch import cpu_env, forked, run

pytestmark = pytest.mark.trainer

STEPS = 4
KINDS = ("llama", "qwen2")
TOLERANCE = 1e-5
WORLDS = {2: ["ddp2", "cp2"], 4: ["pp2-cp2"]}


@pytest.mark.timeout(300)
def test_hf_models_train_under_cp_as_without(tmp_path: Path) -> None:
    docs = corpus_documents()
    job = {
        "models": {k: str(make_hf_folder(tmp_path / k, k, seed=i)) for i, k in enumerate(KINDS)},
        "train": str(write_jsonl(tmp_path / "train.jsonl", docs * 3)),
        "validation": str(write_jsonl(tmp_path / "val.jsonl", validation_documents())),
        "evalEvery": 2,
        "steps": STEPS,
        "exportRoot": str(tmp_path / "out"),
    }
    results = {}
    for world, layouts in WORLDS.items():
        job_file, out = tmp_path / f"job-{world}.json", tmp_path / f"out-{world}.json"
        job_file.write_text(json.dumps({**job, "layouts": layouts}))
        script = str(Path(__file__).with_name("hf_check.py"))
        proc = run(forked(world, script, str(job_file), str(out)), cpu_env(), timeout=200)
        assert proc.returncode == 0, proc.stderr[-4000:]
        results |= json.loads(out.read_text())
    gaps = {}
    for kind, folder in job["models"].items():
        cp1 = results[f"{kind}/ddp2"]
        assert cp1["eval"][-1]["loss"] < cp1["eval"][0]["loss"] - 0.05, cp1  # it really trains
        expected = rule_loss(Path(folder), Path(job["validation"]))
        for name in ("cp2", "pp2-cp2"):
            got = results[f"{kind}/{name}"]
            assert [e["step"] for e in got["eval"]] == [0, 2, STEPS], got
            assert len(got["losses"]) == STEPS, got
            gaps[f"{kind}/{name}"] = {
                "step0": abs(got["eval"][0]["loss"] - expected),
                "losses": max(
                    abs(a - b) for a, b in zip(got["losses"], cp1["losses"], strict=True)
                ),
                "eval": max(
                    abs(a["loss"] - b["loss"])
                    for a, b in zip(got["eval"], cp1["eval"], strict=True)
                ),
            }
    print(json.dumps(gaps))
    assert all(max(gap.values()) < TOLERANCE for gap in gaps.values()), gaps
