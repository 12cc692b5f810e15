"""TensorBoard event files: the trainer's writer and the reader ``meshrun plot`` draws from.

An event file is a sequence of TFRecords (length, masked CRC32C of the length, the bytes, masked
CRC32C of the bytes), each an ``Event`` protocol buffer (tensorflow/core/util/event.proto): the
first names the format (``file_version: "brain.Event:2"``), then one per step holding a
``Summary`` of scalar values (``simple_value``). The few fields used here are written and read
by hand, so the trainer needs neither ``tensorboard`` nor ``protobuf`` (docs/trainer.md, "The
metrics").

A run that resumes from a checkpoint writes a new file in the same folder whose second event is
``SessionLog.START`` at its first step: TensorBoard's reader (``EventAccumulator``) then drops
every value of an earlier file at that step or later, which is how ``SummaryWriter``'s
``purge_step`` keeps a dead run's steps past the checkpoint out of the curves. The reader here
does the same.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

FILE_PREFIX = "events.out.tfevents."
"""TensorBoard reads files whose name contains ``tfevents``; this is the name its writers use:
``events.out.tfevents.<unix seconds>.<host>.<pid>.<n>``, sorted by time."""
FILE_VERSION = b"brain.Event:2"
"""Version 2 tells the reader to purge on ``SessionLog.START`` rather than on a step going back."""
SESSION_START = 1
"""``SessionLog.SessionStatus.START``."""

# The series the trainer writes (one value per step; eval/loss where there is validation data).
LOSS = "train/loss"
LEARNING_RATE = "train/learning_rate"
GRAD_NORM = "train/grad_norm"
TOKENS_PER_SECOND = "train/tokens_per_second"
STEP_SECONDS = "train/step_time_seconds"
PREDICTED_TOKENS_PER_SECOND = "plan/predicted_tokens_per_second"
EVAL_LOSS = "eval/loss"


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, as TFRecord frames use it."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """TFRecord's masked CRC: rotated right by 15 bits plus a constant, so a CRC stored inside
    the data it covers does not check out by accident."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame(record: bytes) -> bytes:
    """One TFRecord: the length, its masked CRC, the record, its masked CRC (little-endian)."""
    length = struct.pack("<Q", len(record))
    return (
        length
        + struct.pack("<I", masked_crc(length))
        + record
        + struct.pack("<I", masked_crc(record))
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1  # negative int64s as two's complement, ten bytes
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _field(number, 2) + _varint(len(data)) + data


def event(
    wall_time: float,
    step: int,
    *,
    scalars: Mapping[str, float] | None = None,
    file_version: bytes | None = None,
    session_start: bool = False,
) -> bytes:
    """An ``Event``: wall_time (1, double), step (2, int64), file_version (3), summary (5: its
    values (1), each a tag (1) and a simple_value (2, float)), session_log (7: its status, 1)."""
    out = _field(1, 1) + struct.pack("<d", wall_time) + _field(2, 0) + _varint(step)
    if file_version is not None:
        out += _bytes_field(3, file_version)
    if scalars:
        values = b"".join(
            _bytes_field(1, _bytes_field(1, tag.encode()) + _field(2, 5) + struct.pack("<f", v))
            for tag, v in scalars.items()
        )
        out += _bytes_field(5, values)
    if session_start:
        out += _bytes_field(7, _field(1, 0) + _varint(SESSION_START))
    return out


class EventWriter:
    """Appends scalar events to a new event file in ``folder`` (made if missing).

    ``purge_from``: the first step this run writes, after a resume; every value an earlier file
    of the folder holds at that step or later is to be dropped.
    """

    def __init__(self, folder: str | Path, purge_from: int | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / new_file_name(self.folder)
        self._file: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 (closed by close())
        now = time.time()
        self._file.write(frame(event(now, 0, file_version=FILE_VERSION)))
        if purge_from is not None:
            self._file.write(frame(event(now, purge_from, session_start=True)))
        self._file.flush()

    def scalars(
        self, step: int, values: Mapping[str, float], wall_time: float | None = None
    ) -> None:
        """One event holding ``values`` (tag: number) at ``step``; buffered until :meth:`flush`."""
        wall = time.time() if wall_time is None else wall_time
        self._file.write(frame(event(wall, step, scalars=values)))

    def flush(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        if not self._file.closed:
            self.flush()
            self._file.close()


def new_file_name(folder: Path) -> str:
    """A name that sorts after every event file already in ``folder``: readers take the files
    in name order, so a restart within the same second as the dead run's file still comes
    after it."""
    seconds = int(time.time())
    for existing in folder.glob(f"*{FILE_PREFIX[:-1]}*"):
        parts = existing.name.split(".")
        if len(parts) > 3 and parts[3].isdigit():
            seconds = max(seconds, int(parts[3]) + 1)
    return f"{FILE_PREFIX}{seconds:010d}.{socket.gethostname()}.{os.getpid()}.0"


# ---- reading ------------------------------------------------------------------------------


class EventFileError(ValueError):
    """An event file that is not one (a bad frame or checksum before its end)."""


def records(data: bytes, name: str = "") -> list[bytes]:
    """The TFRecords of ``data``, checksums checked; a last record cut short (a file still
    being written) is left out."""
    out, offset = [], 0
    while offset + 12 <= len(data):
        header = data[offset : offset + 8]
        (length,) = struct.unpack("<Q", header)
        (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
        if masked_crc(header) != header_crc:
            raise EventFileError(f"{name}: bad length checksum at byte {offset}")
        end = offset + 12 + length + 4
        if end > len(data):
            break
        body = data[offset + 12 : offset + 12 + length]
        (body_crc,) = struct.unpack("<I", data[end - 4 : end])
        if masked_crc(body) != body_crc:
            raise EventFileError(f"{name}: bad record checksum at byte {offset}")
        out.append(body)
        offset = end
    return out


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """(number, wire type, value) of each field of a protocol-buffer message; a varint as int,
    fixed64/fixed32 and length-delimited fields as their bytes."""
    out: list[tuple[int, int, int | bytes]] = []
    offset = 0
    while offset < len(data):
        key, offset = _read_varint(data, offset)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, offset = _read_varint(data, offset)
        elif wire == 1:
            value, offset = data[offset : offset + 8], offset + 8
        elif wire == 5:
            value, offset = data[offset : offset + 4], offset + 4
        elif wire == 2:
            size, offset = _read_varint(data, offset)
            value, offset = data[offset : offset + size], offset + size
        else:
            raise EventFileError(f"unsupported protocol-buffer wire type {wire}")
        out.append((number, wire, value))
    return out


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def decode_event(record: bytes) -> tuple[int, dict[str, float], bool]:
    """(step, scalar values by tag, whether it is a SessionLog.START) of one ``Event``."""
    step, scalars, start = 0, {}, False
    for number, _, value in _fields(record):
        if number == 2 and isinstance(value, int):
            step = _signed(value)
        elif number == 5 and isinstance(value, bytes):
            for sub, _, item in _fields(value):
                if sub != 1 or not isinstance(item, bytes):
                    continue
                tag, number_value = None, None
                for key, _, part in _fields(item):
                    if key == 1 and isinstance(part, bytes):
                        tag = part.decode("utf-8", "replace")
                    elif key == 2 and isinstance(part, bytes):
                        (number_value,) = struct.unpack("<f", part)
                if tag is not None and number_value is not None:
                    scalars[tag] = number_value
        elif number == 7 and isinstance(value, bytes):
            start = any(k == 1 and v == SESSION_START for k, _, v in _fields(value))
    return step, scalars, start


def read_scalars(folder: str | Path) -> dict[str, dict[int, float]]:
    """Every scalar series of the event files in ``folder`` (tag: {step: value}), the files in
    name order: a later value at a step replaces an earlier one, and a SessionLog.START at step
    s drops every value at step s or later, as TensorBoard's reader does."""
    series: dict[str, dict[int, float]] = {}
    for path in sorted(Path(folder).glob(f"*{FILE_PREFIX[:-1]}*")):
        if not path.is_file():
            continue
        for record in records(path.read_bytes(), str(path)):
            step, scalars, start = decode_event(record)
            if start:
                for values in series.values():
                    for old in [s for s in values if s >= step]:
                        del values[old]
            for tag, value in scalars.items():
                series.setdefault(tag, {})[step] = value
    return series
