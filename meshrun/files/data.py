"""A job's own training data (``spec.training.data``) and the checks that need no torch.

Formats: ``jsonl`` (one JSON object per line), ``parquet``, ``arrow`` (a folder written by
``datasets``' ``save_to_disk``) and ``tokens`` (token ids already packed: ``.npy``, or raw
``uint16``/``uint32`` named ``*.u16``/``*.u32``/``*.bin``). Text is tokenized with the model's
``tokenizer.json`` once per dataset into a cache beside it (meshrun_trainer.components.data.tokens).
What can be checked from the files alone, before any process starts, is here: paths, the text field,
the tokenizer's vocabulary against the model's, and the dataset's size when it is known without
tokenizing (token files, or a text dataset's cache).
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any, get_args

from meshrun.api.errors import SpecError
from meshrun.api.spec import Data, DataFormat
from meshrun.files.bounded import (
    LINE_CAP,
    TOKENIZER_CAP,
    in_kernel_filesystem,
    is_regular,
    open_regular,
    open_regular_text,
    read_bounded,
    read_text_bounded,
)

Format = DataFormat
FORMATS: tuple[Format, ...] = get_args(DataFormat)
FIELD = "spec.training.data"
CACHE_DIR = ".meshrun-cache"
"""The folder beside a text dataset where its tokens are cached."""
NPY_HEADER_CAP = 2**16
"""A .npy header is a short dict literal (NEP 1 pads it to 64 bytes)."""
WIDE_VOCAB = 2**16
"""Vocabularies above this need uint32 token ids."""


def data_files(format: Format, path: str | Path) -> list[Path]:
    """The files holding a dataset, in order (an arrow folder's shards as state.json lists)."""
    root = Path(path)
    if format != "arrow":
        return [root]
    state = root / "state.json"
    if is_regular(state):
        listed = json.loads(read_text_bounded(state, FIELD)).get("_data_files", [])
        return [root / entry["filename"] for entry in listed]
    return sorted(root.glob("*.arrow"))


def _first_record(format: Format, file: Path) -> dict[str, Any] | None:
    if format == "jsonl":
        with open_regular_text(file, FIELD) as handle:
            while line := handle.readline(LINE_CAP):
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


def check_data_files(spec: Data, field: str = FIELD) -> None:
    """Every file exists, and text formats have the text field; SpecError names the field."""
    validation = spec.validation.path if spec.validation is not None else None
    for key, path in (("path", spec.path), ("validation.path", validation)):
        if path is None:
            continue
        if in_kernel_filesystem(path):
            raise SpecError(f"{field}.{key}", f"{path} is a kernel file, not a job's data")
        files = data_files(spec.format, path)
        if not Path(path).exists() or not files:
            raise SpecError(f"{field}.{key}", f"{path} does not exist (or holds no data files)")
        for file in files:
            if not is_regular(file):
                raise SpecError(f"{field}.{key}", f"{file} does not exist as a regular file")
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
    data = json.loads(read_text_bounded(tokenizer_json, "spec.model.hf.path", TOKENIZER_CAP))
    ids = [int(i) for i in (data.get("model", {}).get("vocab") or {}).values()]
    ids += [int(t["id"]) for t in data.get("added_tokens", [])]
    return max(ids, default=-1) + 1


def check_tokenizer(tokenizer_json: Path | None, model_vocab: int, field: str) -> None:
    """The tokenizer exists and all its ids fit the model's embedding."""
    if tokenizer_json is None or not is_regular(tokenizer_json):
        raise SpecError(field, "text data needs the model folder's tokenizer.json, none found")
    vocab = tokenizer_vocab(tokenizer_json)
    if vocab > model_vocab:
        raise SpecError(
            field,
            f"the tokenizer has {vocab} tokens but the model's vocabulary is {model_vocab} "
            "(config.json vocab_size)",
        )


def cache_key(format: Format, path: str | Path, field: str, tokenizer_json: Path) -> str:
    """A key over the tokenizer, the text field and the files' names, sizes and times: it tells
    a current cache from a stale one, not a cache someone planted (see :func:`cache_trusted`)."""
    digest = hashlib.sha256(read_bounded(tokenizer_json, "spec.model.hf.path", TOKENIZER_CAP))
    digest.update(f"{format}\0{field}".encode())
    for file in data_files(format, path):
        stat = file.stat()
        digest.update(f"\0{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def data_owners(format: Format, path: str | Path) -> frozenset[int]:
    """The users owning the dataset's files: whoever could write the data itself."""
    owners = set()
    for file in data_files(format, path):
        with contextlib.suppress(OSError):
            owners.add(file.stat().st_uid)
    return frozenset(owners)


def own_cache_dir() -> Path:
    """The folder of caches this user makes where it does not own the data (the temp dir)."""
    return Path(tempfile.gettempdir()) / f"meshrun-tokens-{os.geteuid()}"


def cache_path(
    format: Format, path: str | Path, field: str, tokenizer_json: Path, vocab: int
) -> Path:
    """Where the tokens of this dataset are cached: beside it when this user owns the data and
    may write there, else in a folder of its own in the temp dir (a cache beside the data is
    read only when its owner could have written the data, :func:`cache_trusted`)."""
    data = Path(path)
    suffix = "u16" if vocab <= WIDE_VOCAB else "u32"
    name = f"{data.name}.{cache_key(format, path, field, tokenizer_json)}.{suffix}"
    beside = data.parent / CACHE_DIR
    owner = os.geteuid() in data_owners(format, path)
    if owner and (os.access(data.parent, os.W_OK) or os.access(beside, os.W_OK)):
        return beside / name
    return own_cache_dir() / name


def cache_trusted(cache: Path, format: Format, path: str | Path) -> bool:
    """Whether the tokens at ``cache`` may be trained on instead of tokenizing the data: a
    regular file of one name (not a link), writable by its owner alone, owned by someone who
    could have changed the data itself (an owner of the dataset's files, or root), or by this
    user in its own folder of the temp dir.

    The key (names, sizes, times) is easy to match; who wrote the file is not. Whoever may write
    the folder beside a shared dataset but not the dataset cannot plant tokens that another
    team's job takes for that dataset's: such a cache is not read, and the job tokenizes into
    a cache of its own."""
    try:
        info = os.lstat(cache)
    except OSError:
        return False
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        return False
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return False
    owners = data_owners(format, path) | {0}
    if cache.parent == own_cache_dir():
        try:
            folder = os.lstat(cache.parent)
        except OSError:
            return False
        if folder.st_uid == os.geteuid() and not folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            owners |= {os.geteuid()}
    return info.st_uid in owners


def token_width(path: Path, vocab: int) -> int:
    """Bytes per id of a raw token file: ``.u32`` 4, ``.u16`` 2, ``.bin`` by the vocabulary."""
    wide = path.suffix in (".u32", ".uint32") or (path.suffix == ".bin" and vocab > WIDE_VOCAB)
    return 4 if wide else 2


def _npy_length(path: Path) -> int | None:
    """The length of a 1-D ``.npy`` array, read from its header (NEP 1 format), else None."""
    with open_regular(path, FIELD) as handle:
        magic = handle.read(8)
        if magic[:6] != b"\x93NUMPY":
            return None
        size = 2 if magic[6] == 1 else 4
        length = min(int.from_bytes(handle.read(size), "little"), NPY_HEADER_CAP)
        header = handle.read(length).decode("latin1")
    shape = ast.literal_eval(header).get("shape")
    return int(shape[0]) if isinstance(shape, tuple) and len(shape) == 1 else None


def known_tokens(spec: Data, path: str, tokenizer_json: Path | None, vocab: int) -> int | None:
    """Tokens in a dataset when known without tokenizing: a token file's length, or a text
    dataset's cache (written by meshrun prepare-data or an earlier run); else None."""
    file = Path(path)
    if spec.format == "tokens":
        return (
            _npy_length(file)
            if file.suffix == ".npy"
            else file.stat().st_size // token_width(file, vocab)
        )
    if tokenizer_json is None or not is_regular(tokenizer_json):
        return None
    cache = cache_path(spec.format, path, spec.text_field, tokenizer_json, vocab)
    if not cache_trusted(cache, spec.format, path):
        return None
    return cache.stat().st_size // token_width(cache, vocab)


def check_dataset_size(tokens: int, seq_len: int, global_batch: int, field: str) -> None:
    """At least one global batch of training windows (validation: one window)."""
    windows = tokens // (seq_len + 1)
    if windows < global_batch:
        need = "one window" if global_batch == 1 else f"one global batch of {global_batch}"
        raise SpecError(
            field,
            f"the dataset holds {tokens} tokens, {windows} windows of seqLen + 1 = "
            f"{seq_len + 1}: fewer than {need}",
        )
