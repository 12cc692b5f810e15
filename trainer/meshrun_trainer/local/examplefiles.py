"""``meshrun example-files DIR``: the files examples/hf-finetune.yaml reads, made on this machine
without network: a tiny Llama as a Hugging Face folder (config.json, random weights in
model.safetensors, a byte-level BPE tokenizer.json trained on the shipped corpus) and the
corpus's paragraphs as JSON Lines, split into training and validation documents.

The layout mirrors the example's volumes: ``DIR/models/tiny-llama``, ``DIR/data/train.jsonl``,
``DIR/data/val.jsonl``, and ``DIR/out`` for the export.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from meshrun.api.presets import ModelShape
from meshrun.files.hf import expected_shapes
from meshrun_trainer.models.hf import hf_config

EOS = "</s>"
TOKENIZER_VOCAB = 320
"""The byte alphabet (256), EOS, and 63 merges."""
SHAPE = ModelShape(
    layers=4,
    hidden=64,
    heads=4,
    vocab=384,  # above the tokenizer's 320, and divisible by tensor-parallel degrees 2, 4 and 8
    seq_len=256,  # config.json's max_position_embeddings; jobs train on shorter windows
    ffn_hidden=192,
    kv_heads=2,
    norm_eps=1e-6,
)
"""The tiny Llama's shape (grouped-query attention, 2 key/value heads)."""
VALIDATION_DOCUMENTS = 3
"""The corpus's last paragraphs, held out for validation."""
INIT_STD = 0.02


def corpus_documents() -> list[str]:
    """The shipped corpus's paragraphs (its comment header dropped), one document each."""
    text = resources.files("meshrun_trainer").joinpath("data", "corpus.txt").read_text("utf-8")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    return [paragraph.strip() for paragraph in body.split("\n\n") if paragraph.strip()]


def write_tokenizer(folder: Path, documents: list[str]) -> Tokenizer:
    """A byte-level BPE tokenizer with an EOS token, saved as transformers loads it."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(documents, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS}
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return tokenizer


def write_model(folder: Path, documents: list[str], seed: int = 0) -> Path:
    """The tiny Llama with random weights (N(0, 0.02), norms 1) and its tokenizer."""
    tokenizer = write_tokenizer(folder, documents)
    config = hf_config(SHAPE, None, "float32") | {"eos_token_id": tokenizer.token_to_id(EOS)}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    rng = np.random.default_rng(seed)
    tensors = {
        name: np.ones(shape, np.float32)
        if name.endswith("norm.weight")
        else (rng.standard_normal(shape) * INIT_STD).astype(np.float32)
        for name, shape in expected_shapes(SHAPE).items()
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def write_jsonl(path: Path, documents: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"text": document, "chars": len(document)}) for document in documents]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_example(root: Path, seed: int = 0) -> dict[str, Path]:
    """Every file of the example under ``root``; returns the container path -> local folder."""
    documents = corpus_documents()
    write_model(root / "models" / "tiny-llama", documents, seed)
    write_jsonl(root / "data" / "train.jsonl", documents[:-VALIDATION_DOCUMENTS])
    write_jsonl(root / "data" / "val.jsonl", documents[-VALIDATION_DOCUMENTS:])
    (root / "out").mkdir(parents=True, exist_ok=True)
    return {f"/{name}": root / name for name in ("models", "data", "out")}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="meshrun example-files",
        description="Write a tiny random Llama folder, its tokenizer and JSON Lines data for "
        "examples/hf-finetune.yaml (no network).",
    )
    parser.add_argument("dir", metavar="DIR", help="where to write models/, data/ and out/")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args(argv)
    mounts = write_example(Path(args.dir).resolve(), args.seed)
    flags = " ".join(f"--mount {container}={local}" for container, local in mounts.items())
    print(f"wrote {', '.join(str(path) for path in mounts.values())}", file=sys.stderr)
    print(f"meshrun run --local examples/hf-finetune.yaml {flags}")
    return 0
