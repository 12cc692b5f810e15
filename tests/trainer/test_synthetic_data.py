"""Data streams: deterministic per step, layout-independent, and a lossless byte tokenizer."""

from __future__ import annotations

import pytest
import torch
from meshrun_trainer.components.data.synthetic import (
    CorpusStream,
    SyntheticStream,
    decode,
    encode,
    load_corpus,
    replica_rows,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "make", [lambda: SyntheticStream(256, 32, 8, 5), lambda: CorpusStream(32, 8, 5)]
)
def test_batches_are_a_pure_function_of_seed_and_step(make) -> None:  # type: ignore[no-untyped-def]
    first, second = make(), make()
    # Out of order on purpose: resuming at step 7 must not depend on steps 1-6 having run.
    x7, y7 = first.global_batch(7)
    second.global_batch(1)
    x7b, y7b = second.global_batch(7)
    assert torch.equal(x7, x7b) and torch.equal(y7, y7b)
    assert x7.shape == (8, 32) and y7.shape == (8, 32)
    assert torch.equal(x7[:, 1:], y7[:, :-1]), "targets are the inputs shifted by one"
    assert not torch.equal(first.global_batch(8)[0], x7)


def test_seed_changes_the_data() -> None:
    a = SyntheticStream(256, 16, 4, 1).global_batch(1)[0]
    b = SyntheticStream(256, 16, 4, 2).global_batch(1)[0]
    assert not torch.equal(a, b)


def test_synthetic_rows_follow_their_progression() -> None:
    x, y = SyntheticStream(97, 16, 4, 0).global_batch(3)
    stride = (x[:, 1] - x[:, 0]) % 97
    assert torch.equal((x + stride[:, None]) % 97, y)
    assert int(x.max()) < 97


def test_replicas_partition_the_global_batch() -> None:
    batch = torch.arange(8 * 3).view(8, 3)
    parts = [replica_rows(batch, rank, 4) for rank in range(4)]
    assert torch.equal(torch.cat(parts), batch)


def test_tokenizer_round_trips_and_corpus_is_real_text() -> None:
    text = "Shall I compare thee to a summer's day?"
    assert decode(encode(text)) == text
    assert max(encode("é")) < 256
    corpus = load_corpus()
    assert corpus.numel() > 5000
    assert "Four score and seven years ago" in decode(corpus.tolist())


def test_the_planner_knows_the_corpus_length() -> None:
    from meshrun.rules.strategy import CORPUS_BYTES

    # meshrun.rules.strategy refuses seqLen + 1 >= CORPUS_BYTES for dataset corpus, at plan time.
    assert load_corpus().numel() == CORPUS_BYTES
    with pytest.raises(ValueError):
        CorpusStream(CORPUS_BYTES - 1, 1, 0)
    CorpusStream(CORPUS_BYTES - 2, 1, 0)
