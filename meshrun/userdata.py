"""A job's own training data (``spec.training.data``) and the checks that need no torch.

Formats: ``jsonl`` (one JSON object per line), ``parquet``, ``arrow`` (a folder written by
``datasets``' ``save_to_disk``) and ``tokens`` (token ids already packed: ``.npy``, or raw
``uint16``/``uint32`` named ``*.u16``/``*.u32``/``*.bin``). Text is tokenized with the model's
``tokenizer.json``; the trainer does that (meshrun_trainer.tokens). What can be checked from the
files alone, before any process starts, is here: paths, the text field, the tokenizer's
vocabulary against the model's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from meshrun.errors import SpecError

Format = Literal["jsonl", "parquet", "arrow", "tokens"]
FORMATS: tuple[Format, ...] = ("jsonl", "parquet", "arrow", "tokens")
FIELD = "spec.training.data"


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """spec.training.data: where the text is and how to read it."""

    format: Format
    """jsonl, parquet, arrow (save_to_disk folder) or tokens (pre-tokenized ids)."""
    path: str
    """The training file or folder (a container path in pods, a local path for local runs)."""
    text_field: str = "text"
    """The field holding each document's text (not used by ``tokens``)."""
    validation: str | None = None
    """A held-out file or folder in the same format, or None."""
    eval_every: int = 0
    """Evaluate on ``validation`` every this many steps (0: only before and after training)."""


def data_spec(data: dict[str, Any]) -> DataSpec:
    """Read the spec's ``training.data`` mapping (defaults already applied or not)."""
    kind = data.get("format", "jsonl")
    if kind not in FORMATS:
        raise SpecError(f"{FIELD}.format", f"must be one of {', '.join(FORMATS)}, got {kind!r}")
    path = data.get("path")
    if not path:
        raise SpecError(f"{FIELD}.path", "is required")
    validation = (data.get("validation") or {}).get("path")
    every = int(data.get("evalEverySteps", 0))
    if every < 0:
        raise SpecError(f"{FIELD}.evalEverySteps", f"must be >= 0, got {every}")
    return DataSpec(
        format=kind,
        path=str(path),
        text_field=str(data.get("textField", "text")),
        validation=str(validation) if validation else None,
        eval_every=every,
    )


def data_files(format: Format, path: str | Path) -> list[Path]:
    """The files holding a dataset, in order (an arrow folder's shards as state.json lists)."""
    root = Path(path)
    if format != "arrow":
        return [root]
    state = root / "state.json"
    if state.is_file():
        listed = json.loads(state.read_text(encoding="utf-8")).get("_data_files", [])
        return [root / entry["filename"] for entry in listed]
    return sorted(root.glob("*.arrow"))


def _first_record(format: Format, file: Path) -> dict[str, Any] | None:
    if format == "jsonl":
        with open(file, encoding="utf-8") as handle:
            for line in handle:
                if line.strip():
                    record = json.loads(line)
                    return record if isinstance(record, dict) else {}
        return None
    try:
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:  # the core without the trainer extra: the trainer checks it
        return None
    if format == "parquet":
        names = pyarrow.parquet.read_schema(file).names
    else:
        with pyarrow.memory_map(str(file)) as source:
            names = pyarrow.ipc.open_stream(source).schema.names
    return dict.fromkeys(names)


def check_data_files(spec: DataSpec, field: str = FIELD) -> None:
    """Every file exists, and text formats have the text field; SpecError names the field."""
    for key, path in (("path", spec.path), ("validation.path", spec.validation)):
        if path is None:
            continue
        files = data_files(spec.format, path)
        if not Path(path).exists() or not files:
            raise SpecError(f"{field}.{key}", f"{path} does not exist (or holds no data files)")
        for file in files:
            if not file.is_file():
                raise SpecError(f"{field}.{key}", f"{file} does not exist")
        if spec.format == "tokens":
            continue
        try:
            record = _first_record(spec.format, files[0])
        except (OSError, ValueError) as error:
            raise SpecError(f"{field}.{key}", f"{files[0]} is not {spec.format}: {error}") from None
        if record is not None and spec.text_field not in record:
            raise SpecError(
                f"{field}.textField",
                f"{files[0]} has no field {spec.text_field!r} (it has {sorted(record)[:8]})",
            )


def tokenizer_vocab(tokenizer_json: Path) -> int:
    """Ids a ``tokenizer.json`` can produce: its model's vocabulary plus added tokens."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    ids = [int(i) for i in (data.get("model", {}).get("vocab") or {}).values()]
    ids += [int(t["id"]) for t in data.get("added_tokens", [])]
    return max(ids, default=-1) + 1


def check_tokenizer(tokenizer_json: Path | None, model_vocab: int, field: str) -> None:
    """The tokenizer exists and all its ids fit the model's embedding."""
    if tokenizer_json is None or not tokenizer_json.is_file():
        raise SpecError(field, "text data needs the model folder's tokenizer.json, none found")
    vocab = tokenizer_vocab(tokenizer_json)
    if vocab > model_vocab:
        raise SpecError(
            field,
            f"the tokenizer has {vocab} tokens but the model's vocabulary is {model_vocab} "
            "(config.json vocab_size)",
        )
