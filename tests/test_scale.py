"""Set-up in bounded memory: encoding in chunks, the teacher on a bounded sample, a bad row named in one line; the
memory bench's figure."""

import os
import subprocess
import sys
import time

import pytest
import torch

import data.datamodule
import data.teacher
from data.datamodule import EncodedSplit
from data.sources import DataError, read_table
from data.tokenizer import train_tokenizer
from data.teacher import out_of_fold_probabilities

TEXTS = [f"{'good' if i % 2 else 'bad'} film number {i} " + "and more " * (i % 7) for i in range(60)]
LABELS = [i % 2 for i in range(60)]


def test_encoding_in_chunks_gives_the_ids_of_one_piece(monkeypatch):
    tokenizer = train_tokenizer(TEXTS, vocab_size=200, max_length=8, kind="word")
    whole = EncodedSplit.encode(tokenizer, TEXTS, LABELS, max_length=8)
    monkeypatch.setattr(data.datamodule, "ENCODE_CHUNK", 7)  # 60 texts: 8 full chunks and a short one
    chunked = EncodedSplit.encode(tokenizer, TEXTS, LABELS, max_length=8)
    assert torch.equal(chunked.ids, whole.ids) and torch.equal(chunked.offsets, whole.offsets)
    assert chunked.lengths == whole.lengths and max(whole.lengths) == 8


@pytest.mark.slow  # nine teacher fits
def test_the_teacher_fits_on_a_bounded_sample_and_scores_every_text(monkeypatch):
    fitted_sizes = []
    fit = data.teacher.fit_ngram_teacher

    def recording(texts, *rest):
        fitted_sizes.append(len(texts))
        return fit(texts, *rest)

    monkeypatch.setattr(data.teacher, "fit_ngram_teacher", recording)
    monkeypatch.setattr(data.teacher, "CHUNK", 4)
    probabilities = out_of_fold_probabilities(TEXTS, LABELS, 2, folds=3, sample=30)
    assert probabilities.shape == (60, 2)
    assert torch.allclose(probabilities.sum(1), torch.ones(60))  # every text scored, the 30 outside the sample too
    assert fitted_sizes == [20, 20, 20]  # each fold's teacher: two thirds of the sample, never more
    fitted_sizes.clear()
    assert torch.equal(out_of_fold_probabilities(TEXTS, LABELS, 2, folds=3, sample=60),
                       out_of_fold_probabilities(TEXTS, LABELS, 2, folds=3))  # all fit in the sample: no sampling
    assert fitted_sizes == [40] * 6


def test_a_row_with_too_many_fields_is_named_in_one_line(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text('text,label\n"good film",pos\n"bad film",neg,extra\n"fine",pos\n')
    with pytest.raises(DataError, match=r"bad\.csv: .*line 3") as error:
        read_table(path, "text", "label")
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_the_memory_bench_counts_the_whole_process_tree():
    from bench.scale import tree_rss

    alone = tree_rss(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import sys; b = bytearray(300 * 2**20); sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    try:
        for _ in range(100):  # until the child has its 300 MiB
            if tree_rss(os.getpid()) - alone > 250 * 2**20:
                break
            time.sleep(0.05)
        assert tree_rss(os.getpid()) - alone > 250 * 2**20
        assert tree_rss(child.pid) > 250 * 2**20
    finally:
        child.communicate(b"")


@pytest.mark.slow  # imports Lightning (bench.scale)
def test_the_size_bench_makes_distinct_texts_from_the_shipped_ones(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    from bench.scale import write_texts

    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "train.tsv").write_text("sentence\tlabel\n" + "".join(
        f"a film of {i} minutes and more words\t{i % 2}\n" for i in range(20)))
    monkeypatch.setenv("ATTENTION_DATA_ROOT", str(tmp_path))
    monkeypatch.setattr("bench.scale.WRITE_CHUNK", 16)
    write_texts(tmp_path / "set.parquet", 100, "short")
    table = pq.read_table(tmp_path / "set.parquet")
    texts = table.column("text").to_pylist()
    assert len(texts) == 100 and texts[:20] == [f"a film of {i} minutes and more words" for i in range(20)]
    assert len(set(texts)) > 90  # copies have their words shuffled
    assert set(table.column("label").to_pylist()) == {0, 1}
