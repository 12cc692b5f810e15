"""Hugging Face mixtures of experts in and out: a tiny Mixtral and a tiny Qwen2-MoE (shared
expert behind its gate, a first dense layer, unnormalized top-k) built with transformers give
the logits transformers gives at step 0 under expert parallelism 1, 2 and 4 (fp32, within
1e-4 absolute), train to the same losses at every ep, and export folders that transformers
loads without a missing or unexpected weight, holding the trained (changed) weights, the same
at every ep."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from hf_factories import make_hf_folder
from hf_moe_check import EPS
from trainer_launch import cpu_env, forked, run

pytestmark = pytest.mark.trainer

MOE_KINDS = {
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 48},
    "qwen2_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "mlp_only_layers": [0],
        "norm_topk_prob": False,
    },
}
LOGITS_ATOL = 1e-4


@pytest.mark.timeout(600)
def test_hf_moe_logits_training_and_export(tmp_path: Path) -> None:
    folders = {
        kind: make_hf_folder(tmp_path / kind, kind, seed=3, num_hidden_layers=2, **config)
        for kind, config in MOE_KINDS.items()
    }
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    job = {
        "models": {kind: str(folder) for kind, folder in folders.items()},
        "ids": ids.tolist(),
        "steps": 2,
        "exportRoot": str(tmp_path / "exports"),
    }
    (tmp_path / "exports").mkdir()
    job_file, out = tmp_path / "job.json", tmp_path / "out.json"
    job_file.write_text(json.dumps(job))
    script = str(Path(__file__).with_name("hf_moe_check.py"))
    proc = run(forked(4, script, str(job_file), str(out)), cpu_env(), timeout=560)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(out.read_text())
    for kind, folder in folders.items():
        original = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        with torch.no_grad():
            want = original(ids).logits
        first = results[f"{kind}/ep1"]
        exported = {}
        for ep in EPS:
            got = results[f"{kind}/ep{ep}"]
            logits = torch.load(got["logits"])
            assert (logits - want).abs().max().item() <= LOGITS_ATOL, (kind, ep)
            assert got["losses"] == pytest.approx(first["losses"], rel=1e-4), (kind, ep)
            model, info = transformers.AutoModelForCausalLM.from_pretrained(
                got["export"], dtype=torch.float32, output_loading_info=True
            )
            assert not info["missing_keys"] and not info["unexpected_keys"], (kind, ep, info)
            exported[ep] = model.state_dict()
        before = original.state_dict()
        for key, value in exported[1].items():
            for ep in EPS[1:]:
                assert torch.allclose(exported[ep][key], value, atol=1e-5), (kind, ep, key)
        router = next(k for k in before if k.endswith("mlp.gate.weight"))
        expert = next(k for k in before if "experts" in k)
        for key in (router, expert):
            assert not torch.equal(exported[1][key], before[key]), (kind, key, "trained")
