"""A checkpoint is read without running code from it: a ``.metadata`` or a saved value that
names anything but what DCP writes is refused, naming the file and the global, and its payload
never runs (one process, no torchrun)."""

from __future__ import annotations

import builtins
import io
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
from meshrun_trainer.components import safeload, statedicts
from meshrun_trainer.components.optim import make_optimizer
from meshrun_trainer.components.safeload import MetadataUnpickler, UnsafeCheckpoint, allowed_global
from meshrun_trainer.models.llama import build_model
from meshrun_trainer.runner import Runner
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from meshrun.api.presets import PRESETS

pytestmark = pytest.mark.unit


class Payload:
    """Unpickles as a call of ``call`` with ``args`` (what an attacker's file would hold)."""

    def __init__(self, call: Any, *args: Any) -> None:
        self.call, self.args = call, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.call, self.args


def _state(seed: int) -> tuple[Runner, dict[str, Any]]:
    model = build_model(PRESETS["tiny"], seed)
    runner = Runner([model], [make_optimizer(model.parameters(), 0.01)], None, True, True)
    return runner, statedicts.merged(statedicts.part_states(runner))


def _checkpoint(directory: Path) -> Path:
    dcp_save(_state(1)[1], checkpoint_id=str(directory), no_dist=True)
    return directory / ".metadata"


def _load(directory: Path) -> None:
    statedicts.load(_state(2)[1], str(directory), no_dist=True)


ATTACKS = {  # the callable each payload runs, and the global its pickle names
    "os.system": (os.system, "posix.system"),
    "builtins.open": (builtins.open, "io.open"),
    "builtins.exec": (builtins.exec, "builtins.exec"),
    "torch.save": (torch.save, "torch.serialization.save"),  # torch, but not a dtype
}


def _payload(attack: str, marker: Path) -> Payload:
    """A payload that creates ``marker`` with the callable of ``attack``."""
    call = ATTACKS[attack][0]
    if call is os.system:
        return Payload(call, f"touch {marker}")
    if call is builtins.exec:
        return Payload(call, f"open({str(marker)!r}, 'w')")
    if call is torch.save:
        return Payload(call, 0, str(marker))
    return Payload(call, str(marker), "w")


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_metadata_that_runs_code_is_refused_and_its_payload_never_runs(
    tmp_path: Path, attack: str
) -> None:
    metadata = _checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "ran"
    real = pickle.loads(metadata.read_bytes())
    assert isinstance(real, Metadata)
    # Hidden inside a real Metadata (the payload is not the first object read), and alone.
    real.storage_meta = _payload(attack, marker)  # type: ignore[assignment]
    for crafted in (pickle.dumps(real), pickle.dumps(_payload(attack, marker))):
        metadata.write_bytes(crafted)
        with pytest.raises(UnsafeCheckpoint) as refused:
            _load(tmp_path / "ckpt")
        assert str(refused.value).startswith(
            f"{metadata}: refused to load the global {ATTACKS[attack][1]}: "
        ), str(refused.value)
        assert not marker.exists(), "the payload ran"


def test_a_metadata_past_the_cap_or_not_a_file_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metadata = _checkpoint(tmp_path / "ckpt")
    size = metadata.stat().st_size
    _load(tmp_path / "ckpt")  # the real one loads under the cap
    monkeypatch.setattr(safeload, "METADATA_CAP", size - 1)
    with pytest.raises(UnsafeCheckpoint, match=f"is {size} bytes, more than the {size - 1}"):
        _load(tmp_path / "ckpt")
    monkeypatch.undo()
    metadata.unlink()
    os.mkfifo(metadata)  # a read of it would wait for a writer forever
    with pytest.raises(UnsafeCheckpoint, match="not a regular file"):
        _load(tmp_path / "ckpt")


def test_torchs_own_reader_would_run_the_same_payload(tmp_path: Path) -> None:
    """What the safe reader prevents: DCP's FileSystemReader unpickles the file as it is."""
    metadata = _checkpoint(tmp_path / "ckpt")
    marker = tmp_path / "ran"
    metadata.write_bytes(pickle.dumps(_payload("builtins.open", marker)))
    with pytest.raises(BaseException):  # noqa: B017 (the file object is no Metadata)
        dcp_load(_state(2)[1], storage_reader=FileSystemReader(tmp_path / "ckpt"), no_dist=True)
    assert marker.exists()


def test_a_saved_value_that_runs_code_is_refused(tmp_path: Path) -> None:
    """Non-tensor values (the optimizer's settings) are saved with torch.save and DCP's default
    planner reads them with weights_only=False; here they are read with weights_only=True."""
    marker = tmp_path / "ran"
    saved = _state(1)[1]
    key = next(k for k in saved["optim"] if k.startswith("param_groups.") and k.endswith(".lr"))
    saved["optim"][key] = _payload("builtins.open", marker)
    dcp_save(saved, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    with pytest.raises(UnsafeCheckpoint) as refused:
        _load(tmp_path / "ckpt")
    assert str(refused.value) == (
        f"{tmp_path / 'ckpt'}: refused to load the checkpoint value optim.{key}: it names the "
        "global io.open, not a tensor or a plain Python value, so it was not written by DCP"
    )
    assert not marker.exists(), "the payload ran"


def test_only_what_dcp_writes_is_allowed() -> None:
    assert allowed_global("torch", "float32") is torch.float32
    assert allowed_global("torch", "Size") is torch.Size
    assert allowed_global("torch.distributed.checkpoint.metadata", "Metadata") is Metadata
    for module, name in [
        ("torch", "load"),  # a torch function, not a dtype
        ("torch", "_C"),
        ("torch.distributed.checkpoint.metadata", "Any"),  # imported there, not its own
        ("torch.distributed.checkpoint.metadata", "field"),
        ("builtins", "eval"),
        ("pathlib", "Path"),  # may be a WindowsPath, and Path has file methods anyway
        ("collections", "namedtuple"),
        ("subprocess", "Popen"),
    ]:
        assert allowed_global(module, name) is None, (module, name)


def test_an_enum_member_pickled_through_getattr_loads_and_no_other_getattr_does() -> None:
    """Debian's Python 3.11 (the trainer image's) pickles DCP's memory-format members as
    ``getattr(enum, name)``: that loads; getattr on anything else is refused unrun."""
    from torch.distributed.checkpoint import metadata as dcp_metadata

    encoding = dcp_metadata._MEM_FORMAT_ENCODING
    member = encoding.TORCH_CONTIGUOUS_FORMAT
    data = pickle.dumps(Payload(getattr, encoding, "TORCH_CONTIGUOUS_FORMAT"))
    assert MetadataUnpickler(io.BytesIO(data), "m").load() is member
    for target, name in [
        (encoding, "__class__"),  # an attribute, not a member
        (Metadata, "__init__"),  # one of DCP's classes, but not an enum
        (torch.Size, "__new__"),
    ]:
        data = pickle.dumps(Payload(getattr, target, name))
        with pytest.raises(UnsafeCheckpoint, match="not a member of DCP's own enums"):
            MetadataUnpickler(io.BytesIO(data), "m").load()


def _rewrite_entries(metadata_path: Path, **changes: Any) -> None:
    """Rewrite every data entry of a real checkpoint's .metadata with ``changes``."""
    metadata = pickle.loads(metadata_path.read_bytes())
    for info in metadata.storage_data.values():
        for field, value in changes.items():
            setattr(info, field, value)
    metadata_path.write_bytes(pickle.dumps(metadata))


@pytest.mark.parametrize(
    "changes",
    [
        {"relative_path": "/dev/zero", "length": 1 << 40},
        {"relative_path": "../outside.distcp"},
        {"relative_path": "sub/__0_0.distcp"},
        {"offset": -1},
    ],
    ids=["absolute", "parent", "subfolder", "negative"],
)
def test_data_entries_outside_the_checkpoints_folder_are_refused_before_a_read(
    tmp_path: Path, changes: dict[str, Any]
) -> None:
    """An entry naming /dev/zero with a terabyte's length would fill memory, one naming a
    file elsewhere would read it: both are refused with the entry named."""
    metadata = _checkpoint(tmp_path / "ckpt")
    _rewrite_entries(metadata, **changes)
    with pytest.raises(UnsafeCheckpoint, match=r"ckpt: (model|optim)\."):
        _load(tmp_path / "ckpt")


def test_a_stream_transform_the_trainer_never_writes_is_refused(tmp_path: Path) -> None:
    """DCP decompresses an entry marked zstd whatever its size: the trainer writes no
    transforms, so an entry with one is not its checkpoint."""
    metadata = _checkpoint(tmp_path / "ckpt")
    _rewrite_entries(metadata, transform_descriptors=["stream.zstd/1"])
    with pytest.raises(UnsafeCheckpoint, match=r"\['stream.zstd/1'\].*writes no transforms"):
        _load(tmp_path / "ckpt")


def test_a_data_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    _checkpoint(directory)
    data = sorted(directory.glob("*.distcp"))
    assert data
    data[0].unlink()
    os.mkfifo(data[0])  # a read would wait for a writer forever
    with pytest.raises(UnsafeCheckpoint, match="not a regular file"):
        _load(directory)
