"""Text datasets to one flat array of token ids, tokenized once and cached next to the data.

Each document is tokenized with the model's ``tokenizer.json`` (the ``tokenizers`` library, no
network) without added special tokens, the EOS token is appended, and the documents are
concatenated in file order: the stream the validation loss is defined on and the training
windows are cut from (meshrun_trainer.components.data.windows). The result is cached as raw
``uint16`` (or ``uint32`` for vocabularies past 65,535) in ``.meshrun-cache/`` beside the data,
named by a key over the tokenizer, the text field and the files' sizes and times, so a restart or
another rank memory-maps it instead of tokenizing again. A cache is read only when its owner could
have written the data itself (meshrun.files.data.cache_trusted); a job that does not own the
data keeps its cache in a folder of its own in the temp dir. ``tokens`` datasets are
memory-mapped as they are.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

from meshrun.api.errors import SpecError
from meshrun.files.bounded import (
    LINE_CAP,
    TOKENIZER_CAP,
    is_regular,
    open_regular_text,
    read_text_bounded,
)
from meshrun.files.data import Format, data_files, own_cache_dir, token_width
from meshrun.files.hf import FIELD

if TYPE_CHECKING:
    from tokenizers import Tokenizer

BATCH = 1024
"""Documents handed to the tokenizer at once (it encodes a batch on all cores)."""


def eos_id(model_folder: Path, tokenizer: Tokenizer) -> int:
    """The EOS token: tokenizer_config.json's ``eos_token``, else config.json's ``eos_token_id``."""
    names: list[str | None] = []
    config_file = model_folder / "tokenizer_config.json"
    if is_regular(config_file):
        eos = json.loads(read_text_bounded(config_file, FIELD, TOKENIZER_CAP)).get("eos_token")
        names.append(eos.get("content") if isinstance(eos, dict) else eos)
    for name in names:
        found = tokenizer.token_to_id(name) if name else None
        if found is not None:
            return int(found)
    config = json.loads(read_text_bounded(model_folder / "config.json", FIELD))
    eos_ids = config.get("eos_token_id")
    if isinstance(eos_ids, list) and eos_ids:
        return int(eos_ids[0])
    if isinstance(eos_ids, int):
        return eos_ids
    raise SpecError(
        FIELD,
        "no EOS token: tokenizer_config.json has no eos_token and config.json no eos_token_id",
    )


def documents(format: Format, path: str | Path, field: str) -> Iterator[list[str]]:
    """Batches of document texts in file order."""
    for file in data_files(format, path):
        if format == "jsonl":
            yield from _jsonl(file, field)
            continue
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet

        if format == "parquet":
            parquet = pyarrow.parquet.ParquetFile(file)
            if field not in parquet.schema_arrow.names:
                raise SpecError("spec.training.data.textField", f"{file} has no column {field!r}")
            for batch in parquet.iter_batches(batch_size=BATCH, columns=[field]):
                yield [str(t) for t in batch.column(0).to_pylist()]
            continue
        with pyarrow.memory_map(str(file)) as source:
            reader = pyarrow.ipc.open_stream(source)
            if field not in reader.schema.names:
                raise SpecError("spec.training.data.textField", f"{file} has no column {field!r}")
            for batch in reader:
                yield [str(t) for t in batch.column(field).to_pylist()]


def _jsonl(file: Path, field: str) -> Iterator[list[str]]:
    batch: list[str] = []
    with open_regular_text(file, "spec.training.data.path") as handle:
        for number, line in enumerate(iter(lambda: handle.readline(LINE_CAP), ""), 1):
            if not line.strip():
                continue
            try:
                batch.append(str(json.loads(line)[field]))
            except (ValueError, KeyError, TypeError):
                raise SpecError(
                    "spec.training.data.textField",
                    f"{file}:{number}: not a JSON object with a {field!r} field",
                ) from None
            if len(batch) == BATCH:
                yield batch
                batch = []
    if batch:
        yield batch


def tokenize(
    format: Format,
    path: str | Path,
    field: str,
    model_folder: Path,
    out: Path,
    vocab: int,
    quiet: bool = False,
) -> Path:
    """Tokenize the dataset into ``out`` (written under a temporary name, then renamed)."""
    # imported here: the tokenizers package costs every trainer process 0.2 s to import, and
    # only jobs that read text need it
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_folder / "tokenizer.json"))
    eos = eos_id(model_folder, tokenizer)
    dtype = np.uint16 if out.suffix == ".u16" else np.uint32
    if out.parent == own_cache_dir():
        out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    total_bytes = sum(f.stat().st_size for f in data_files(format, path))
    started, count, docs = time.perf_counter(), 0, 0
    columns = (
        TextColumn(f"tokenizing {Path(path).name}"),
        BarColumn(),
        TaskProgressColumn(),
        TextColumn("{task.fields[tokens]} tokens"),
        TimeRemainingColumn(),
    )
    console = Console(stderr=True)
    with open(tmp, "wb") as handle, Progress(*columns, console=console, disable=quiet) as bar:
        os.fchmod(handle.fileno(), 0o644)  # writable by its owner alone, whatever the umask
        task = bar.add_task("tokenize", total=total_bytes, tokens=0)
        for batch in documents(format, path, field):
            encoded = tokenizer.encode_batch(batch, add_special_tokens=False)
            ids = [token for item in encoded for token in (*item.ids, eos)]
            if ids and max(ids) >= vocab:
                raise SpecError("spec.model.hf.path", f"token id {max(ids)} >= vocab {vocab}")
            np.asarray(ids, dtype=dtype).tofile(handle)
            count, docs = count + len(ids), docs + len(batch)
            bar.update(task, advance=sum(len(t.encode()) for t in batch), tokens=count)
    os.replace(tmp, out)
    seconds = time.perf_counter() - started
    info = {"documents": docs, "tokens": count, "seconds": round(seconds, 3)}
    out.with_suffix(out.suffix + ".json").write_text(json.dumps(info) + "\n", encoding="utf-8")
    if not quiet:
        print(
            f"meshrun: tokenized {docs} documents into {count} tokens in {seconds:.1f}s "
            f"({count / max(seconds, 1e-9):.0f} tokens/s): {out}",
            file=sys.stderr,
        )
    return out


def load_tokens(path: Path, vocab: int) -> np.ndarray:
    """Memory-map a token file: ``.npy``, or raw ``.u16``/``.u32`` (``.bin``: by vocabulary)."""
    if path.suffix == ".npy":
        array: np.ndarray = np.load(path, mmap_mode="r")
    else:
        wide = token_width(path, vocab) == 4
        array = np.memmap(path, dtype=np.uint32 if wide else np.uint16, mode="r")
    if array.ndim != 1 or array.dtype.kind != "u":
        raise SpecError("spec.training.data.path", f"{path}: needs a 1-D array of unsigned ids")
    return array
