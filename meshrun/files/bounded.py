"""Bounded reads of the files a job names: regular files only, never more than a cap.

A job's author names its paths, so a path may be ``/proc/self/pagemap`` (endless), ``/dev/zero``,
a FIFO (a read that never returns) or a directory where a file is expected. Every read of such a
path goes through :func:`open_regular`, which opens without blocking, refuses anything but a
regular file, and through :func:`read_bounded`, which refuses a file past its cap before reading
it and never reads more than the cap (procfs files report a size of 0 and grow as they are read).
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path
from typing import BinaryIO, TextIO

from meshrun.api.errors import SpecError

MIB = 1024**2
JSON_CAP = 16 * MIB
"""config.json, tokenizer_config.json, an arrow folder's state.json: small JSON files."""
TOKENIZER_CAP = 256 * MIB
"""tokenizer.json (the largest vocabularies' are tens of MiB)."""
HEADER_CAP = 100 * MIB
"""A safetensors header: the format's own limit (the safetensors library refuses larger)."""
LINE_CAP = 64 * MIB
"""One line of a jsonl dataset (one document)."""
KERNEL_FILESYSTEMS = ("/proc", "/sys", "/dev")
"""Where the kernel's files live: regular-looking files there (size 0, endless) are refused."""


def in_kernel_filesystem(path: str | Path) -> bool:
    """``path`` resolves into /proc, /sys or /dev."""
    real = os.path.realpath(path)
    return any(real == top or real.startswith(top + "/") for top in KERNEL_FILESYSTEMS)


def open_regular(path: str | Path, field: str) -> BinaryIO:
    """``path`` opened for reading when it is a regular file; SpecError naming ``field`` else.

    Opened with O_NONBLOCK so a FIFO cannot hang the open; the check is on the opened file
    (fstat), so a path swapped after the check is still refused.
    """
    if in_kernel_filesystem(path):
        raise SpecError(field, f"{path} is a kernel file (/proc, /sys or /dev), not a job's file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as error:
        raise SpecError(field, f"{path} cannot be opened: {error.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise SpecError(field, f"{path} is {kind} (a regular file is needed)")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def open_regular_text(path: str | Path, field: str) -> TextIO:
    """:func:`open_regular`, reading UTF-8 text."""
    return io.TextIOWrapper(open_regular(path, field), encoding="utf-8")


def read_bounded(path: str | Path, field: str, cap: int = JSON_CAP) -> bytes:
    """The bytes of the regular file ``path``, refused (SpecError naming ``field``) past ``cap``."""
    with open_regular(path, field) as handle:
        return read_open_bounded(handle, path, field, cap)


def read_open_bounded(handle: BinaryIO, path: str | Path, field: str, cap: int) -> bytes:
    """The rest of the open file ``handle`` (of ``path``), refused (SpecError naming ``field``)
    past ``cap``: by its size first, then by what was read (a file growing meanwhile)."""
    size = os.fstat(handle.fileno()).st_size
    if size > cap:
        raise SpecError(field, f"{path} is {size} bytes, more than the {cap} allowed")
    data = handle.read(cap + 1)
    if len(data) > cap:
        raise SpecError(field, f"{path} holds more than the {cap} bytes allowed")
    return data


def read_text_bounded(path: str | Path, field: str, cap: int = JSON_CAP) -> str:
    """:func:`read_bounded`, decoded as UTF-8 (SpecError naming ``field`` when it is not)."""
    try:
        return read_bounded(path, field, cap).decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(field, f"{path} is not UTF-8 text: {error.reason}") from None


def is_regular(path: str | Path) -> bool:
    """``path`` is a regular file outside the kernel's filesystems (stat only, never opened)."""
    if in_kernel_filesystem(path):
        return False
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False
