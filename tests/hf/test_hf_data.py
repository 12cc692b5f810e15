"""Data without processes: the same token stream from every format, tokenized once; windows
visited once per epoch and split disjointly over replicas; the LR schedule; clear refusals."""

from __future__ import annotations

import json
import math
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
from meshrun_trainer.components.data.windows import WindowStream, cut_windows
from meshrun_trainer.components.optim import lr_factor

from meshrun.api.errors import SpecError
from meshrun.api.spec import Data, DataFormat, LRSchedule, Validation
from meshrun.files.data import cache_path, check_data_files, check_tokenizer, known_tokens


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
