"""Weights in and out in one process: transformers' tiny Llama, Qwen2 and Mistral, read straight
into meshrun's freshly allocated model (no random initialisation), give the same logits, and an
exported folder loads back in transformers unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from hf_factories import KINDS, VOCAB, make_hf_folder
from meshrun_trainer.models.hf import SafetensorsSource, export
from meshrun_trainer.models.llama import Transformer, build_model
from meshrun_trainer.models.materialize import materialize

from meshrun.api.errors import SpecError
from meshrun.files.hf import load_hf_model

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_same_logits_and_export_round_trip(kind: str, tmp_path: Path) -> None:
    source = make_hf_folder(tmp_path / kind, kind, seed=3)
    reference = transformers.AutoModelForCausalLM.from_pretrained(source).eval()
    folder = load_hf_model(source, seq_len=48)
    with torch.device("meta"):
        model = Transformer(folder.shape)
    materialize([model], torch.device("cpu"), SafetensorsSource(source, folder.shape))
    tokens = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(tokens).logits
        assert (model(tokens) - expected).abs().max().item() < 1e-5
    out = export([model], tmp_path / "out", folder.shape, source=source)
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "tokenizer.json", "model.safetensors.index.json"} <= names
    assert not (tmp_path / ".out.partial").exists()
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        assert torch.equal(back(tokens).logits, expected)


def test_export_of_a_preset_model_loads_in_transformers(tmp_path: Path) -> None:
    from meshrun.api.presets import PRESETS

    shape = PRESETS["tiny"]
    model = build_model(shape, seed=5)
    out = export([model], tmp_path / "tiny", shape)
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"
    back = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokens = torch.randint(0, shape.vocab, (1, shape.seq_len))
    with torch.no_grad():
        assert (back(tokens).logits - model(tokens)).abs().max().item() < 1e-5


def test_weights_not_matching_config_are_refused(tmp_path: Path) -> None:
    source = make_hf_folder(tmp_path / "m", "llama")
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps(config | {"intermediate_size": 128}))
    with pytest.raises(SpecError, match=r"mlp.gate_proj.weight has shape \[96, 64\]"):
        load_hf_model(source, seq_len=16)
    (source / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 5}))
    with pytest.raises(SpecError, match=r"weights lack model\.layers\.4"):
        load_hf_model(source, seq_len=16)


def test_export_copies_only_the_model_folders_own_side_files(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A side file that links out of the model's folder (the pod's environment, a secret
    beside it) is not published; links into the Hugging Face cache's blobs are followed."""
    repo = tmp_path / "hub" / "models--org--tiny"
    source = make_hf_folder(repo / "snapshots" / "rev1", "llama", seed=3)
    blobs = repo / "blobs"
    blobs.mkdir()
    (source / "tokenizer.json").rename(blobs / "0a1b2c")
    (source / "tokenizer.json").symlink_to("../../blobs/0a1b2c")
    secret = tmp_path / "token"
    secret.write_text("SECRET-TOKEN")
    for name, target in (
        ("generation_config.json", "/proc/self/environ"),
        ("special_tokens_map.json", str(secret)),
    ):
        (source / name).unlink(missing_ok=True)
        (source / name).symlink_to(target)
    folder = load_hf_model(source, seq_len=48)
    out = export([build_model(folder.shape, seed=1)], tmp_path / "out", folder.shape, source=source)
    names = {p.name for p in out.iterdir()}
    assert "tokenizer.json" in names
    assert (out / "tokenizer.json").read_bytes() == (blobs / "0a1b2c").read_bytes()
    assert not (out / "tokenizer.json").is_symlink()
    assert "generation_config.json" not in names
    assert "special_tokens_map.json" not in names
    for path in out.rglob("*"):
        if path.is_file():
            assert b"SECRET-TOKEN" not in path.read_bytes(), path
    err = capfd.readouterr().err
    assert "generation_config.json links to /proc/" in err
    assert f"special_tokens_map.json links to {secret}, outside the model's folder" in err
