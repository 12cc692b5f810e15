"""Reading a DCP checkpoint without running code from it.

torch.distributed.checkpoint's FileSystemReader unpickles the checkpoint's ``.metadata`` with
plain ``pickle.load``, and its default load planner reads every non-tensor value
(``BytesStorageMetadata``: the optimizer's learning rate, betas, flags) with
``torch.load(weights_only=False)``: whoever can write the checkpoint volume would run code on
every rank that resumes from it. Here the metadata goes through an unpickler that builds only
what DCP's metadata is made of, and the values through torch's ``weights_only`` loader (tensors
and plain Python values); anything else is refused with the file and the refused name.

What a real checkpoint's ``.metadata`` holds (the same for every layout the trainer writes:
DDP, ZeRO-1/2/3 over FSDP2, pipeline, interleaved pipeline, DTensor TP): the dataclasses and
the memory-format enum of ``torch.distributed.checkpoint.metadata`` (its members pickled as
themselves, or as ``getattr(enum, name)`` by some Pythons), the filesystem's
``_StorageInfo``, ``torch.Size``, torch dtypes, layouts (through
``torch.serialization._get_layout``) and the ``pathlib`` path it was saved to.

Where the data is: each entry of the metadata names a file of the checkpoint's own folder (DCP
writes ``__RANK_N.distcp``), a byte range, and no stream transforms (the trainer writes none:
DCP's zstd extension would decompress whatever the file holds). An entry naming a path outside
the folder (absolute, ``..``, a subfolder), a negative range or a transform is refused, and
each data file is opened only when it is a regular file (never a FIFO or a device, which would
hang the read or feed it without end).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import io
import os
import pathlib
import pickle
import re
from collections.abc import Iterator
from typing import IO, Any, cast

import torch
import torch.distributed.checkpoint.filesystem as dcp_filesystem
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

from meshrun.api.errors import SpecError
from meshrun.files.bounded import open_regular, read_bounded


class UnsafeCheckpoint(pickle.UnpicklingError):
    """A checkpoint file names a Python object DCP's format never holds: it is not loaded."""


def _enum_member(cls: Any, name: Any) -> Any:
    """``getattr(cls, name)``, the way some Pythons pickle an enum member (the 3.11 of Debian's
    trainer image writes DCP's ``_MEM_FORMAT_ENCODING`` members so), for a member of one of
    DCP's own enums only: never an attribute lookup on anything else."""
    if (
        isinstance(cls, type)
        and issubclass(cls, enum.Enum)
        and cls.__module__ == dcp_metadata.__name__
        and isinstance(name, str)
        and name in cls.__members__
    ):
        return cls[name]
    raise UnsafeCheckpoint(f"refused getattr({cls!r}, {name!r}): not a member of DCP's own enums")


NAMED: dict[tuple[str, str], Any] = {
    ("builtins", "getattr"): _enum_member,
    ("torch", "Size"): torch.Size,
    ("torch.serialization", "_get_layout"): torch.serialization._get_layout,
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"): dcp_filesystem._StorageInfo,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("pathlib", "PosixPath"): pathlib.PosixPath,
    ("pathlib", "PurePosixPath"): pathlib.PurePosixPath,
    ("pathlib._local", "PosixPath"): pathlib.PosixPath,
    ("pathlib._local", "PurePosixPath"): pathlib.PurePosixPath,
}
"""Globals a DCP ``.metadata`` may name besides its own classes (each only builds a value)."""

TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)


def allowed_global(module: str, name: str) -> Any | None:
    """The object ``module.name`` when a DCP ``.metadata`` may name it, else None."""
    if (module, name) in NAMED:
        return NAMED[module, name]
    if module == dcp_metadata.__name__:
        # DCP's own metadata classes, whichever this torch has: its dataclasses and enums.
        found = vars(dcp_metadata).get(name)
        if not isinstance(found, type) or found.__module__ != module:
            return None
        return found if dataclasses.is_dataclass(found) or issubclass(found, enum.Enum) else None
    if module == "torch":
        value = vars(torch).get(name)  # never getattr: torch imports submodules lazily
        return value if isinstance(value, TORCH_VALUES) else None
    return None


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds only what :func:`allowed_global` allows; ``path`` is named in
    the refusal."""

    def __init__(self, file: IO[bytes], path: str) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        found = allowed_global(module, name)
        if found is None:
            raise UnsafeCheckpoint(
                f"{self.path}: refused to load the global {module}.{name}: a checkpoint's "
                "metadata holds only torch.distributed.checkpoint's own classes, so this file "
                "was not written by DCP (whoever can write the checkpoint volume could run code "
                "on every rank with it); restore the checkpoint or delete it"
            )
        return found

    def persistent_load(self, pid: Any) -> Any:
        raise UnsafeCheckpoint(f"{self.path}: refused a persistent id: DCP metadata has none")


METADATA_CAP = 1024**3
"""The largest ``.metadata`` read. It grows with tensors times shards: a 405B model's 3,300
weight and moment tensors, each cut into a thousand chunks, describe 3.3 million chunks at about
a hundred bytes each, a third of this."""


def read_metadata_file(path: str | os.PathLike[str]) -> Metadata:
    """The DCP ``Metadata`` in the file at ``path``, built by :class:`MetadataUnpickler`; a
    path that is not a regular file (a FIFO, a device, a directory) or holds more than
    :data:`METADATA_CAP` bytes is refused before it is read."""
    try:
        data = read_bounded(os.fspath(path), "checkpoint", METADATA_CAP)
    except SpecError as error:
        raise UnsafeCheckpoint(error.rule) from None
    metadata = MetadataUnpickler(io.BytesIO(data), str(path)).load()
    if not isinstance(metadata, Metadata):
        raise UnsafeCheckpoint(f"{path}: holds a {type(metadata).__name__}, not DCP Metadata")
    return metadata


def check_storage(metadata: Metadata, directory: str) -> None:
    """Refuse (UnsafeCheckpoint) an entry of ``metadata.storage_data`` that names anything but
    a byte range of a file in the checkpoint's own folder, read as written."""
    storage = metadata.storage_data
    if not isinstance(storage, dict):
        raise UnsafeCheckpoint(f"{directory}: the metadata's storage_data is not a mapping")
    for index, info in storage.items():
        fqn = getattr(index, "fqn", index)
        if not isinstance(info, dcp_filesystem._StorageInfo):
            raise UnsafeCheckpoint(f"{directory}: {fqn} is stored as a {type(info).__name__}")
        name = info.relative_path
        if (
            not isinstance(name, str)
            or name in ("", ".", "..")
            or "/" in name
            or os.sep in name
            or "\0" in name
        ):
            raise UnsafeCheckpoint(
                f"{directory}: {fqn} is stored at {name!r}, not a file of the checkpoint's own "
                "folder (DCP writes every file beside its .metadata)"
            )
        for field in ("offset", "length"):
            value = getattr(info, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise UnsafeCheckpoint(f"{directory}: {fqn} has the {field} {value!r}")
        if info.transform_descriptors:
            raise UnsafeCheckpoint(
                f"{directory}: {fqn} is stored through {list(info.transform_descriptors)!r}: "
                "the trainer writes no transforms (a compressed stream could expand without "
                "bound), so this checkpoint was not written by it"
            )


class RegularFiles(dcp_filesystem.FileSystem):
    """DCP's file system, reading only regular files (a FIFO or a device is refused before a
    byte is read, as the job's other files are)."""

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if mode != "rb":
            raise UnsafeCheckpoint(f"{path}: the checkpoint is opened for reading only")
        try:
            stream = open_regular(os.fspath(path), "checkpoint")
        except SpecError as error:
            raise UnsafeCheckpoint(error.rule) from None
        with stream:
            yield cast(io.IOBase, stream)


class SafeReader(FileSystemReader):
    """torch's FileSystemReader, with the metadata read by :func:`read_metadata_file`.

    The rest of FileSystemReader.read_metadata is kept: its path (the global ``.metadata``, or
    a rank's own with ``rank=``) and the load id it stamps on the metadata. The first refusal
    is kept in ``refused``: DCP reports a failed read as a list of every rank's exceptions, and
    this one is what a person needs to see.
    """

    refused: UnsafeCheckpoint | None = None

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self.fs = RegularFiles()

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        # Every rank: the others get the metadata from the coordinator, not from read_metadata.
        try:
            check_storage(metadata, str(self.path))
        except UnsafeCheckpoint as error:
            self.refused = self.refused or error
            raise
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self.refused is not None:  # DCP's fallback to a rank's own metadata: not after this
            raise self.refused
        path = self._get_metadata_path(kwargs.get("rank"))
        read: dict[str, Metadata] = self.__dict__.setdefault("read", {})
        if str(path) in read:  # checked before DCP's load (statedicts.load), read once
            return read[str(path)]
        try:
            metadata = read_metadata_file(path)
            check_storage(metadata, str(self.path))
        except UnsafeCheckpoint as error:
            self.refused = self.refused or error
            raise
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        assert metadata.storage_meta is not None
        metadata.storage_meta.load_id = self.load_id
        read[str(path)] = metadata
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor values with ``weights_only=True``
    (tensors and plain Python values only) instead of unpickling them; placed as it does.
    ``directory``: the checkpoint, named in a refusal."""

    def __init__(self, directory: str) -> None:
        super().__init__()
        self.directory = directory

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as error:
            # torch's message suggests weights_only=False: the one thing not to do here.
            named = UNSUPPORTED.search(str(error))
            what = f"the global {named.group(1)}" if named else "what torch's weights_only refuses"
            raise UnsafeCheckpoint(
                f"{self.directory}: refused to load the checkpoint value {fqn}: it names {what}, "
                "not a tensor or a plain Python value, so it was not written by DCP"
            ) from None
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded


UNSUPPORTED = re.compile(r"Unsupported global: GLOBAL (\S+)")
"""How torch's weights_only loader names the global it refused."""
