"""Proof against transformers: tiny Llama, Qwen2 (tied embeddings, q/k/v bias) and Mistral models
with random weights, fine-tuned on JSON Lines under DDP, ZeRO-2, ZeRO-3, TP 2, PP 2 and 3D.

- step 0's validation loss equals the loss transformers computes by the documented rule
  (documents tokenized without special tokens, EOS appended, concatenated, cut into seqLen + 1
  windows, mean next-token cross-entropy) within 1e-5;
- every layout's step losses and validation losses match the single-process run within 1e-4;
- each exported folder loads in transformers and its validation loss equals the run's final one
  within 1e-4.
One torchrun launch per world size (1, 2 and 8 processes) trains every model in every layout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
import transformers
from hf_factories import KINDS, corpus_documents, make_hf_folder, validation_documents, write_jsonl
from trainer_launch import cpu_env, forked, run

pytestmark = [pytest.mark.trainer, pytest.mark.slow]

SEQ_LEN = 32
STEPS = 4
WORLDS = {1: ["single"], 2: ["ddp2", "zero2-dp2", "zero3-dp2", "tp2", "pp2"], 8: ["3d"]}


def rule_loss(folder: Path, validation: Path, seq_len: int = SEQ_LEN) -> float:
    """The validation loss exactly as the user guide defines it, computed by transformers."""
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids: list[int] = []
    for line in validation.read_text().splitlines():
        text = json.loads(line)["text"]
        ids += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    count = len(ids) // (seq_len + 1)
    windows = torch.tensor(ids[: count * (seq_len + 1)]).view(count, seq_len + 1)
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), windows[:, 1:].flatten()).item()


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("hf")
    docs = corpus_documents()
    return {
        "models": {k: str(make_hf_folder(root / k, k, seed=i)) for i, k in enumerate(KINDS)},
        "train": str(write_jsonl(root / "train.jsonl", docs * 3)),
        "validation": str(write_jsonl(root / "val.jsonl", validation_documents())),
        "evalEvery": 2,
        "steps": STEPS,
        "exportRoot": str(root / "out"),
    }


def _launch(job: dict[str, Any], world: int, tmp: Path) -> dict[str, Any]:
    job_file, out = tmp / f"job-{world}.json", tmp / f"out-{world}.json"
    job_file.write_text(json.dumps({**job, "layouts": WORLDS[world]}))
    script = str(Path(__file__).with_name("hf_check.py"))
    proc = run(forked(world, script, str(job_file), str(out)), cpu_env(), timeout=560)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results: dict[str, Any] = json.loads(out.read_text())
    return results


@pytest.mark.timeout(900)
def test_every_layout_matches_transformers_and_one_process(
    job: dict[str, Any], tmp_path: Path
) -> None:
    results: dict[str, Any] = {}
    for world in WORLDS:
        results |= _launch(job, world, tmp_path)
    validation = Path(job["validation"])
    gaps: dict[str, dict[str, float]] = {}
    for kind, folder in job["models"].items():
        expected = rule_loss(Path(folder), validation)
        single = results[f"{kind}/single"]
        # The run really trains, or equal losses would prove little.
        assert single["eval"][-1]["loss"] < single["eval"][0]["loss"] - 0.05, single
        for name in (n for names in WORLDS.values() for n in names):
            got = results[f"{kind}/{name}"]
            assert [e["step"] for e in got["eval"]] == [0, 2, STEPS]
            exported = rule_loss(Path(got["export"]), validation)
            gap = {
                "step0": abs(got["eval"][0]["loss"] - expected),
                "losses": max(
                    abs(a - b) for a, b in zip(got["losses"], single["losses"], strict=True)
                ),
                "eval": max(
                    abs(a["loss"] - b["loss"])
                    for a, b in zip(got["eval"], single["eval"], strict=True)
                ),
                "export": abs(exported - got["eval"][-1]["loss"]),
            }
            gaps[f"{kind}/{name}"] = gap
    print(json.dumps(gaps, indent=1))
    bad = {
        k: g
        for k, g in gaps.items()
        if g["step0"] > 1e-5 or g["losses"] > 1e-4 or g["eval"] > 1e-4 or g["export"] > 1e-4
    }
    assert not bad, f"layouts off the reference: {bad}"
