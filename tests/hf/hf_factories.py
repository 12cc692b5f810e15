"""Tiny Hugging Face folders built with transformers and tokenizers (no hub access): random
weights, a byte-level BPE tokenizer trained on the shipped corpus, and JSON Lines documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import transformers
from meshrun_trainer.local.examplefiles import EOS, corpus_documents, write_tokenizer
from tokenizers import Tokenizer

__all__ = [
    "EOS",
    "KINDS",
    "VOCAB",
    "corpus_documents",
    "make_hf_folder",
    "make_tokenizer",
    "validation_documents",
    "write_jsonl",
]

VOCAB = 384
"""Model vocabulary: above the tokenizer's, divisible by every tensor-parallel degree used."""

KINDS: dict[str, dict[str, Any]] = {
    "llama": {
        "rope_theta": 500000.0,
        "max_position_embeddings": 256,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    },
    "qwen2": {"tie_word_embeddings": True},
    "mistral": {"sliding_window": 256},
}
"""Each family with the features that set it apart: Llama 3 RoPE scaling, Qwen2's tied
embeddings and q/k/v bias, Mistral's grouped-query attention with its sliding-window field."""


def make_tokenizer(folder: Path) -> Tokenizer:
    """A byte-level BPE tokenizer with an EOS token, trained on the shipped corpus (the one
    ``meshrun example-files`` writes), saved as transformers expects."""
    return write_tokenizer(folder, corpus_documents())


def validation_documents() -> list[str]:
    """The validation set of the training checks: the corpus's first three documents, 26
    windows of 32 tokens, which is three blocks of a global batch of 8 and a remainder. (Six
    documents made 58 windows: three validations cost more than the four steps they watched.)"""
    return corpus_documents()[:3]


def make_hf_folder(folder: Path, kind: str = "llama", seed: int = 0, **config: Any) -> Path:
    """A tiny ``kind`` model with random weights and a tokenizer, saved at ``folder``."""
    tokenizer = make_tokenizer(folder)
    values = {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-6,
        "eos_token_id": tokenizer.token_to_id(EOS),
        **KINDS.get(kind, {}),
        **config,
    }
    torch.manual_seed(seed)
    built = transformers.AutoConfig.for_model(kind, **values)
    model = transformers.AutoModelForCausalLM.from_config(built, dtype=torch.float32)
    model.save_pretrained(folder)
    return folder


def write_jsonl(path: Path, documents: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for document in documents:
            handle.write(json.dumps({field: document, "id": len(document)}) + "\n")
    return path
