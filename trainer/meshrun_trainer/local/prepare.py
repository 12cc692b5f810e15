"""``meshrun prepare-data``: tokenize a dataset once, before training, into the cache the
trainer reads (``.meshrun-cache/`` beside the data), with a progress bar.

A job tokenizes its data on first use anyway (rank 0, then every rank memory-maps the cache);
running this first moves that time out of the job, e.g. in a pod that mounts the data volume.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from meshrun.api.errors import SpecError
from meshrun.api.spec import Data
from meshrun.files.data import (
    FORMATS,
    cache_path,
    cache_trusted,
    check_data_files,
    check_tokenizer,
)
from meshrun.files.hf import read_config
from meshrun_trainer.components.data.tokens import tokenize


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshrun prepare-data",
        description="Tokenize datasets with a Hugging Face model's tokenizer.json, once.",
    )
    parser.add_argument("paths", nargs="+", metavar="PATH", help="data files or folders")
    parser.add_argument("--model", required=True, help="Hugging Face model folder (tokenizer)")
    parser.add_argument("--format", choices=[f for f in FORMATS if f != "tokens"], default="jsonl")
    parser.add_argument("--text-field", default="text", help="field holding each document")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def prepare(paths: list[str], model: Path, format: str, field: str, quiet: bool) -> list[Path]:
    """Tokenize each dataset unless its cache is current; return the cache files."""
    vocab = int(read_config(model, "--model")["vocab_size"])
    check_tokenizer(model / "tokenizer.json", vocab, "--model")
    done = []
    for path in paths:
        data = Data(format=format, path=path, text_field=field, validation=None, eval_every_steps=0)  # type: ignore[arg-type]
        check_data_files(data)
        out = cache_path(format, path, field, model / "tokenizer.json", vocab)  # type: ignore[arg-type]
        if not cache_trusted(out, format, path):  # type: ignore[arg-type]
            tokenize(format, path, field, model, out, vocab, quiet=quiet)  # type: ignore[arg-type]
        done.append(out)
    return done


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        for out in prepare(args.paths, Path(args.model), args.format, args.text_field, args.quiet):
            print(out)
    except SpecError as error:
        print(f"meshrun prepare-data: {error}", file=sys.stderr)
        return 2
    return 0
