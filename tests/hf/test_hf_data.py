"""Data without processes: the same token stream from every format, tokenized once; windows
visited once per epoch and split disjointly over replicas; the LR schedule; clear refusals."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hf_factories import EOS, corpus_documents, make_tokenizer, write_jsonl
from meshrun_trainer.components.data.synthetic import replica_rows
from meshrun_trainer.components.data.tokens import load_tokens, tokenize
from meshrun_trainer.components.data.windows import WindowStream, cut_windows, dataset_tokens
from meshrun_trainer.components.optim import lr_factor

from meshrun.api.errors import SpecError
from meshrun.api.spec import Data, DataFormat, LRSchedule, Validation
from meshrun.files.data import (
    cache_path,
    cache_trusted,
    check_data_files,
    check_tokenizer,
    known_tokens,
    own_cache_dir,
)


def data(format: DataFormat, path: Path, validation: str | None = None) -> Data:
    """spec.training.data as the CRD defaults it."""
    held_out = Validation(path=validation) if validation else None
    return Data(
        format=format, path=str(path), text_field="text", validation=held_out, eval_every_steps=0
    )


pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("model")
    make_tokenizer(root)
    (root / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return root


def _expected(folder: Path, docs: list[str]) -> list[int]:
    tokenizer = make_tokenizer(folder / "again")
    eos = tokenizer.token_to_id(EOS)
    return [t for d in docs for t in (*tokenizer.encode(d, add_special_tokens=False).ids, eos)]


def test_every_format_gives_the_same_stream_once(folder: Path, tmp_path: Path) -> None:
    docs = corpus_documents()
    write_jsonl(tmp_path / "d.jsonl", docs)
    pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), tmp_path / "d.parquet")
    datasets.Dataset.from_dict({"text": docs}).save_to_disk(tmp_path / "d-arrow", num_shards=3)
    expected = _expected(folder, docs)
    for format, name in (("jsonl", "d.jsonl"), ("parquet", "d.parquet"), ("arrow", "d-arrow")):
        spec = data(format, tmp_path / name)  # type: ignore[arg-type]
        check_data_files(spec)
        tokenizer = folder / "tokenizer.json"
        assert known_tokens(spec, spec.path, tokenizer, 384) is None, "not tokenized yet"
        out = cache_path(spec.format, spec.path, "text", tokenizer, 384)
        assert out.parent == tmp_path / ".meshrun-cache" and out.suffix == ".u16"
        tokenize(spec.format, spec.path, "text", folder, out, vocab=384, quiet=True)
        assert load_tokens(out, 384).tolist() == expected, format
        assert known_tokens(spec, spec.path, tokenizer, 384) == len(expected), "from the cache"
    np.save(tmp_path / "t.npy", np.asarray(expected, dtype=np.uint32))
    assert load_tokens(tmp_path / "t.npy", 384).tolist() == expected
    np.asarray(expected, dtype=np.uint16).tofile(tmp_path / "t.bin")
    for name in ("t.npy", "t.bin"):
        tokens = data("tokens", tmp_path / name)
        assert known_tokens(tokens, tokens.path, None, 384) == len(expected), name


def test_windows_once_per_epoch_and_disjoint_replicas() -> None:
    tokens = np.arange(10 * 9 + 5, dtype=np.uint32)  # 10 windows of 9 tokens, 5 left over
    assert cut_windows(tokens, 8).shape == (10, 9)
    stream = WindowStream(tokens, seq_len=8, batch=4, seed=3)
    assert stream.batches_per_epoch == 2
    seen: dict[int, list[int]] = {0: [], 1: []}
    for step in (1, 2, 3, 4):
        inputs, targets = stream.global_batch(step)
        assert torch.equal(inputs[:, 1:], targets[:, :-1])
        shares = [replica_rows(inputs, r, 2)[:, 0].tolist() for r in (0, 1)]
        assert not set(shares[0]) & set(shares[1])
        seen[stream.epoch_of(step)] += [int(x) // 9 for x in inputs[:, 0]]
    assert len(set(seen[0])) == len(set(seen[1])) == 8, "no window twice in an epoch"
    assert seen[0] != seen[1], "each epoch has its own order"
    again = WindowStream(tokens, seq_len=8, batch=4, seed=3)
    assert torch.equal(again.global_batch(3)[0], stream.global_batch(3)[0])
    assert again.resume_step(stream.state_dict(3)) == 3
    with pytest.raises(SpecError, match="the data changed"):
        WindowStream(tokens[:60], 8, 4, 3).resume_step(stream.state_dict(3))
    with pytest.raises(SpecError, match="fewer than one global batch of 16"):
        WindowStream(tokens, seq_len=8, batch=16, seed=3)


def test_learning_rate_schedule() -> None:
    cosine = LRSchedule(decay="cosine", warmup_steps=4, min_ratio=0.1)
    assert [lr_factor(s, 14, cosine) for s in (1, 2, 4)] == [0.25, 0.5, 1.0]
    assert lr_factor(9, 14, cosine) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lr_factor(14, 14, cosine) == pytest.approx(0.1)
    linear = LRSchedule(decay="linear", warmup_steps=0, min_ratio=0.0)
    assert [lr_factor(s, 4, linear) for s in (1, 2, 4)] == [0.75, 0.5, 0.0]
    constant = LRSchedule(decay="constant", warmup_steps=0, min_ratio=0.0)
    assert lr_factor(7, 10, constant) == 1.0


def test_bad_data_is_refused_naming_the_field(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="does not exist") as caught:
        check_data_files(data("jsonl", tmp_path / "absent.jsonl"))
    assert caught.value.field == "spec.training.data.path"
    write_jsonl(tmp_path / "d.jsonl", ["a", "b"], field="body")
    with pytest.raises(SpecError, match="no field 'text'") as caught:
        check_data_files(data("jsonl", tmp_path / "d.jsonl"))
    assert caught.value.field == "spec.training.data.textField"
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "d.parquet")
    with pytest.raises(SpecError, match="no field 'text'"):
        check_data_files(data("parquet", tmp_path / "d.parquet"))
    write_jsonl(tmp_path / "ok.jsonl", ["a", "b"])
    spec = data("jsonl", tmp_path / "ok.jsonl", validation="/nope.jsonl")
    with pytest.raises(SpecError, match=r"nope\.jsonl does not exist") as caught:
        check_data_files(spec)
    assert caught.value.field == "spec.training.data.validation.path"
    check_tokenizer(folder / "tokenizer.json", 384, "spec.model.hf.path")
    with pytest.raises(SpecError, match="the tokenizer has 320 tokens but the model's vocabulary"):
        check_tokenizer(folder / "tokenizer.json", 256, "spec.model.hf.path")


def test_prepare_data_command_tokenizes_once(
    folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from meshrun.cli.main import main

    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 384}))
    data = write_jsonl(tmp_path / "train.jsonl", corpus_documents())
    argv = ["prepare-data", "--model", str(folder), "--quiet", str(data)]
    assert main(argv) == 0
    out = Path(capsys.readouterr().out.strip())
    assert out.parent == tmp_path / ".meshrun-cache"
    assert load_tokens(out, 384).tolist() == _expected(folder, corpus_documents())
    stamp = out.stat().st_mtime_ns
    assert main(argv) == 0 and out.stat().st_mtime_ns == stamp, "the cache is reused"
    assert main([*argv[:-1], str(tmp_path / "absent.jsonl")]) == 2
    assert "absent.jsonl does not exist" in capsys.readouterr().err


ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file needs root")


def _plant(out: Path, forged: np.ndarray, how: str, elsewhere: Path) -> None:
    """Tokens of the attacker's choosing at the cache's name, as someone who may write the
    folder beside the data but not the data would leave them."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    if how == "link":
        forged.tofile(elsewhere)
        out.symlink_to(elsewhere)
        return
    forged.tofile(out)
    if how == "writable by others":
        out.chmod(0o666)
    elif how == "another owner":
        os.chown(out, 4242, 4242)


@pytest.mark.parametrize(
    "how", ["writable by others", "link", pytest.param("another owner", marks=ROOT_ONLY)]
)
def test_a_cache_planted_beside_the_data_is_not_trained_on(
    folder: Path, tmp_path: Path, how: str
) -> None:
    """The key (names, sizes, times) is easy to match: a cache is read only when its owner
    could have written the data, else the data is tokenized again over it."""
    docs = corpus_documents()
    write_jsonl(tmp_path / "d.jsonl", docs)
    spec = data("jsonl", tmp_path / "d.jsonl")
    tokenizer = folder / "tokenizer.json"
    expected = _expected(folder, docs)
    out = cache_path(spec.format, spec.path, "text", tokenizer, 384)
    assert out.parent == tmp_path / ".meshrun-cache"
    forged = np.full(len(expected), 7, dtype=np.uint16)
    _plant(out, forged, how, tmp_path / "forged.u16")
    assert known_tokens(spec, spec.path, tokenizer, 384) is None, "a planted cache counted"
    assert dataset_tokens(spec, spec.path, folder, 384, quiet=True).tolist() == expected
    assert not out.is_symlink() and out.stat().st_uid == os.geteuid()
    assert known_tokens(spec, spec.path, tokenizer, 384) == len(expected)


@ROOT_ONLY
def test_a_job_that_does_not_own_the_data_caches_in_a_folder_of_its_own(
    folder: Path, tmp_path: Path
) -> None:
    docs = corpus_documents()
    write_jsonl(tmp_path / "d.jsonl", docs)
    os.chown(tmp_path / "d.jsonl", 4242, 4242)
    spec = data("jsonl", tmp_path / "d.jsonl")
    out = cache_path(spec.format, spec.path, "text", folder / "tokenizer.json", 384)
    assert out.parent == own_cache_dir()
    out.unlink(missing_ok=True)
    expected = _expected(folder, docs)
    assert dataset_tokens(spec, spec.path, folder, 384, quiet=True).tolist() == expected
    assert cache_trusted(out, spec.format, spec.path)
    assert not (tmp_path / ".meshrun-cache").exists()
    assert own_cache_dir().stat().st_mode & 0o777 == 0o700
    out.unlink()
