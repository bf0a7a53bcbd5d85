"""Set-up in bounded memory: texts read from Arrow columns a chunk at a time (own files, hub-style local copies, the
cache), encoding in chunks, the teacher on a bounded sample, a bad row named in one line; the memory bench's figure."""

import os
import random
import subprocess
import sys
import time

import pyarrow as pa
import pytest
import torch
from conftest import ROOT, rows, write

import data.columns
import data.encoded
import data.sizes
import training.ngram_teacher
from data.columns import TextColumn
from data.datamodule import TextDataModule
from data.encoded import EncodedSplit
from data.reading import read_table
from data.sources import DataError, load_splits
from data.tokenizer import train_tokenizer
from training.ngram_teacher import out_of_fold_probabilities

TEXTS = [f"{'good' if i % 2 else 'bad'} film number {i} " + "and more " * (i % 7) for i in range(60)]
LABELS = [i % 2 for i in range(60)]


def test_a_text_column_reads_as_the_list_of_its_texts_across_arrow_chunks(monkeypatch):
    monkeypatch.setattr(data.columns, "CHUNK", 3)  # iteration reads 3 rows at a time
    texts = [f"text {i}" for i in range(25)]
    column = TextColumn(pa.chunked_array([pa.array(texts[at : at + 4]) for at in range(0, 25, 4)]))
    assert len(column) == 25 and list(column) == texts and column[-1] == texts[-1] and column[9] == texts[9]
    assert column[3:9] == texts[3:9] and column[::5] == texts[::5] and column[30:] == []
    picked = column.take([20, 3, 4, 11])
    assert list(picked) == [texts[i] for i in (20, 3, 4, 11)] and picked[1:3] == texts[3:5] and picked[-1] == texts[11]
    assert list(picked.take([3, 0])) == [texts[11], texts[20]]
    assert list(TextColumn(pa.array([42, None]))) == ["42", None]  # numbers are texts; missing is None
    with pytest.raises(IndexError):
        column[25]


def test_an_own_file_is_read_and_encoded_a_chunk_at_a_time(tmp_path, monkeypatch):
    path = write(tmp_path / "own.parquet", rows(6) + [("  ", "pos")])  # 72 texts and a blank one
    read_sizes = []
    as_texts = data.columns.as_texts
    monkeypatch.setattr(data.columns, "as_texts", lambda values: read_sizes.append(len(values)) or as_texts(values))
    monkeypatch.setattr(data.columns, "CHUNK", 5)
    monkeypatch.setattr(data.encoded, "ENCODE_CHUNK", 5)
    monkeypatch.setattr(data.sizes, "MEASURE_CHUNK", 5)
    built = TextDataModule(train_file=str(path), cache_dir=str(tmp_path / "cache"))  # sizes chosen: two more passes
    assert len(built.split("train")) + len(built.split("validation")) == 72
    assert read_sizes and max(read_sizes) <= 5  # every read of the texts (six passes) was one chunk of them
    splits = load_splits(train_file=str(path), dataset="sst2", data_dir=None, val_file=None, test_file=None,
                         text_column=None, label_column=None, val_fraction=0.1, seed=0)
    assert all(isinstance(texts, TextColumn) for texts in splits.texts.values())
    assert sorted(list(splits.texts["train"]) + list(splits.texts["validation"])) == sorted(t for t, _ in rows(6))
    train = list(splits.texts["train"])
    as_list = EncodedSplit.encode(built.tokenizer, train, splits.labels["train"], built.max_length)
    assert torch.equal(built.split("train").ids, as_list.ids)


def test_a_hub_style_local_copy_is_split_and_its_cache_read_again_without_the_files(tmp_path, monkeypatch):
    folder = tmp_path / "root" / "imdb"  # the layout of the shipped copy: train.parquet and test.parquet
    folder.mkdir(parents=True)
    write(folder / "train.parquet", [(t, int(y == "pos")) for t, y in rows(5)])
    write(folder / "test.parquet", [("a fine film", 1), ("", 0), ("a dull film", 0)])
    monkeypatch.setenv("ATTENTION_DATA_ROOT", str(tmp_path / "root"))
    settings = {"dataset": "imdb", "cache_dir": str(tmp_path / "cache"), "vocab_size": 60, "max_length": 8}
    built = TextDataModule(**settings)
    assert built.label_names == ["negative", "positive"]
    assert [len(built.split(name)) for name in ("train", "validation", "test")] == [54, 6, 2]  # the empty text skipped
    monkeypatch.setattr("datasets.load_dataset", lambda *_, **__: pytest.fail("the files were read again"))
    again = TextDataModule(**settings)
    for name in ("train", "validation", "test"):
        assert torch.equal(again.split(name).ids, built.split(name).ids)
        assert torch.equal(again.split(name).labels, built.split(name).labels)


def test_a_bad_json_line_is_named_by_its_line_in_the_file(tmp_path):
    path = write(tmp_path / "own.jsonl", rows())
    lines = path.read_text().splitlines()
    lines[5] = '{"text": "a film cut short", "label": '
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"own\.jsonl: line 6 is not valid JSON") as error:
        read_table(path, "text", "label")
    assert "\n" not in str(error.value)


def test_encoding_in_chunks_gives_the_ids_of_one_piece(monkeypatch):
    tokenizer = train_tokenizer(TEXTS, vocab_size=200, max_length=8, kind="word")
    whole = EncodedSplit.encode(tokenizer, TEXTS, LABELS, max_length=8)
    monkeypatch.setattr(data.encoded, "ENCODE_CHUNK", 7)  # 60 texts: 8 full chunks and a short one
    chunked = EncodedSplit.encode(tokenizer, TEXTS, LABELS, max_length=8)
    assert torch.equal(chunked.ids, whole.ids) and torch.equal(chunked.offsets, whole.offsets)
    assert chunked.lengths == whole.lengths and max(whole.lengths) == 8


@pytest.mark.slow  # nine teacher fits
def test_the_teacher_fits_on_a_bounded_sample_and_scores_every_text(monkeypatch):
    fitted_sizes = []
    fit = training.ngram_teacher.fit_ngram_teacher

    def recording(texts, *rest):
        fitted_sizes.append(len(texts))
        return fit(texts, *rest)

    monkeypatch.setattr(training.ngram_teacher, "fit_ngram_teacher", recording)
    monkeypatch.setattr(training.ngram_teacher, "CHUNK", 4)
    probabilities = out_of_fold_probabilities(TEXTS, LABELS, 2, folds=3, sample=30)
    assert probabilities.shape == (60, 2)
    assert torch.allclose(probabilities.sum(1), torch.ones(60))  # every text scored, the 30 outside the sample too
    assert fitted_sizes == [20, 20, 20]  # each fold's teacher: two thirds of the sample, never more
    fitted_sizes.clear()
    assert torch.equal(out_of_fold_probabilities(TEXTS, LABELS, 2, folds=3, sample=60),
                       out_of_fold_probabilities(TEXTS, LABELS, 2, folds=3))  # all fit in the sample: no sampling
    assert fitted_sizes == [40] * 6


def test_above_the_size_rule_the_teacher_hashes_its_n_grams_and_stays_out_of_fold(monkeypatch):
    # As in test_distillation: each text one word of its own, its label a coin flip, so only a teacher that had seen
    # a text could agree with its label much more often than half the time.
    hashed_fits = []
    fit = training.ngram_teacher.fit_ngram_teacher

    def recording(texts, labels, C, class_weight, hashed):
        hashed_fits.append(hashed)
        return fit(texts, labels, C, class_weight, hashed)

    monkeypatch.setattr(training.ngram_teacher, "fit_ngram_teacher", recording)
    monkeypatch.setattr(training.ngram_teacher, "HASH_FEATURES", 2**14)  # fewer columns: a quicker fit, same path
    rng = random.Random(1)
    texts = [f"word{i} word{i}x" for i in range(300)]
    labels = [rng.randrange(2) for _ in texts]
    chars = sum(map(len, texts))
    probabilities = out_of_fold_probabilities(texts, labels, 2, folds=3, exact_chars=chars - 1)
    assert hashed_fits == [True] * 3
    assert probabilities.shape == (300, 2) and torch.allclose(probabilities.sum(1), torch.ones(300))
    assert 0.35 < (probabilities.argmax(1) == torch.tensor(labels)).float().mean().item() < 0.65
    hashed_fits.clear()
    out_of_fold_probabilities(texts, labels, 2, folds=3, exact_chars=chars)  # at the rule: the exact vocabulary
    assert hashed_fits == [False] * 3


def label_sets(count: int, seed: int) -> list[list[int]]:
    """Three labels, each a coin flip for each text."""
    rng = random.Random(seed)
    return [[c for c in range(3) if rng.random() < 0.5] for _ in range(count)]


def exact_label_probabilities(texts, sets, num_classes, folds, seed=0, C=4.0):
    """The several-labels teacher before its size rule (main acba157): the exact vocabulary on every text, each fold
    scored at once; the reference the small path must still equal."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import KFold
    from sklearn.multiclass import OneVsRestClassifier

    y = np.zeros((len(texts), num_classes), dtype=np.int64)
    for row, indices in enumerate(sets):
        y[row, indices] = 1
    probabilities = np.zeros((len(texts), num_classes), dtype=np.float32)
    texts = np.asarray(texts, dtype=object)
    for fitted, scored in KFold(folds, shuffle=True, random_state=seed).split(texts):
        present = np.flatnonzero((y[fitted].sum(0) > 0) & (y[fitted].sum(0) < len(fitted)))
        vectorizer = training.ngram_teacher.ngram_features(list(texts[fitted]))
        x = vectorizer.fit_transform(texts[fitted])
        x.sum_duplicates()
        teacher = OneVsRestClassifier(LogisticRegression(C=C, solver="liblinear"), n_jobs=1)
        teacher.fit(x, y[fitted][:, present])
        probabilities[np.ix_(scored, present)] = teacher.predict_proba(vectorizer.transform(texts[scored]))
    return torch.from_numpy(probabilities)


def test_below_the_size_rule_the_several_labels_teacher_is_unchanged(monkeypatch):
    monkeypatch.setattr(training.ngram_teacher, "CHUNK", 7)  # each fold scored 7 texts at a time
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)  # the label fits in this process
    sets = label_sets(60, seed=2)
    assert torch.equal(out_of_fold_probabilities(TEXTS, sets, 3, folds=3),
                       exact_label_probabilities(TEXTS, sets, 3, folds=3))


def test_the_several_labels_teacher_fits_a_bounded_sample_of_hashed_n_grams_out_of_fold(monkeypatch):
    # Each text one word of its own, each label a coin flip: only a teacher that had seen a text could agree with its
    # labels much more often than half the time.
    fits = []
    fit_ngrams = training.ngram_teacher.fit_ngrams

    def recording(texts, hashed):
        fits.append((len(texts), hashed))
        return fit_ngrams(texts, hashed)

    monkeypatch.setattr(training.ngram_teacher, "fit_ngrams", recording)
    monkeypatch.setattr(training.ngram_teacher, "HASH_FEATURES", 2**14)  # fewer columns: a quicker fit, same path
    monkeypatch.setattr(training.ngram_teacher, "CHUNK", 40)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    texts = [f"word{i} word{i}x" for i in range(300)]
    sets = label_sets(300, seed=1)
    probabilities = out_of_fold_probabilities(texts, sets, 3, folds=3, sample=150, exact_chars=100)
    assert fits == [(100, True)] * 3  # two thirds of the 150-text sample, hashed: over 100 characters
    assert probabilities.shape == (300, 3) and probabilities.min() >= 0 and probabilities.max() <= 1
    truth = torch.zeros(300, 3, dtype=torch.bool)
    for row, labels in enumerate(sets):
        truth[row, labels] = True
    assert (probabilities > 0).all()  # every text scored, the 150 outside the sample too
    assert 0.35 < ((probabilities >= 0.5) == truth).float().mean().item() < 0.65


def test_hashed_n_grams_are_the_exact_tf_idf_when_nothing_collides():
    from sklearn.feature_extraction.text import TfidfVectorizer

    texts, unseen = ["a good film", "a bad film and a bad end", "good good"], ["a good end", "new words only"]
    exact, hashed = training.ngram_teacher.ngram_features(texts), training.ngram_teacher.HashedNgrams(texts)
    assert isinstance(exact, TfidfVectorizer)
    for x, y in ((exact.fit_transform(texts), hashed.fit_transform(texts)), (exact.transform(unseen),
                                                                             hashed.transform(unseen))):
        # The same weights in other columns (no two n-grams share one here): each row's sorted nonzero values.
        # An n-gram no fitted text has ("good end", "new words") weighs 0 in both.
        for row in range(x.shape[0]):
            weights = [torch.tensor(sorted(v for v in m[row].data if v), dtype=torch.float64) for m in (x, y)]
            assert torch.allclose(*weights, atol=1e-6)


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


def test_freed_memory_is_returned_every_n_batches_and_before_a_larger_batch_of_enough_tokens(monkeypatch):
    import torch

    import training.memory

    trims = []
    monkeypatch.setattr(training.memory, "return_freed_memory", lambda: trims.append(1))
    callback = training.memory.ReturnFreedMemory(every=3, min_tokens=0)

    def batches(lengths):  # trims before each batch, one per length (texts × padded length = 2 × length)
        counts = []
        for length in lengths:
            before = len(trims)
            callback.on_train_batch_start(None, None, {"input_ids": torch.zeros(2, length)}, 0)
            counts.append(len(trims) - before)
        return counts

    callback.on_train_epoch_start(None, None)
    assert trims == [1]
    # every 3rd batch, and before a batch larger than all since the last trim (not one as large or smaller)
    assert batches([10, 10, 5, 4, 4, 4, 4]) == [0, 0, 0, 1, 0, 0, 1]
    assert batches([4, 9, 9, 8]) == [0, 1, 0, 0]
    callback.on_validation_epoch_start(None, None)
    assert len(trims) == 5
    callback.on_validation_batch_start(None, None, {"input_ids": torch.zeros(2, 3)}, 0)
    callback.on_validation_batch_start(None, None, {"input_ids": torch.zeros(2, 30)}, 1)
    assert len(trims) == 6
    callback.on_validation_end(None, None)  # what validation and the monitor's figures left
    assert len(trims) == 7
    # batches under min_tokens trigger nothing, however many or however growing; the first one over it does
    callback.min_tokens = 40
    assert batches([1, 2, 3, 4, 5, 6, 7, 19, 20]) == [0, 0, 0, 0, 0, 0, 0, 0, 1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_large_blocks_are_mapped_on_their_own_after_map_large_blocks():
    """A command's process (runtime.py) keeps a freed 16 MiB block in the heap (speed), which serves the next 6 MiB;
    once the heap's free pages are handed back (return_freed_memory, as ReturnFreedMemory does), a 6 MiB block the
    heap cannot serve is mapped on its own after map_large_blocks(1 MiB) (mallinfo2's mapped bytes hold it), so
    freeing it hands it straight back. In a fresh process."""
    script = """
import ctypes, sys
import runtime
from data.cache import return_freed_memory
from training.memory import map_large_blocks
runtime.configure()
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6")
if not hasattr(libc, "mallinfo2"):
    print("skip"); sys.exit()
libc.mallinfo2.restype = Info
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.free(libc.malloc(16 << 20))  # kept in the heap for reuse (runtime.py)
def mapped(size):  # the block is kept, so the heap's top has no room for the next one
    before = libc.mallinfo2().hblkhd
    libc.malloc(size)
    return libc.mallinfo2().hblkhd - before >= size
print(mapped(6 << 20), map_large_blocks(1 << 20), return_freed_memory(), mapped(6 << 20))
"""
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    if result.stdout.strip() == "skip":
        pytest.skip("not glibc 2.33 or later")
    assert result.stdout.split() == ["False", "True", "None", "True"]


def test_memory_callback_is_on_with_no_config_and_in_the_imdb_configs(capsys):
    """A run whose config lists no callbacks gets ReturnFreedMemory beside the monitor (DEFAULT_CALLBACKS,
    training/commands.py); the IMDB configs, which list their own, list it too."""
    import yaml

    import train
    from training.commands import DEFAULT_CALLBACKS

    names = [c["class_path"] for c in DEFAULT_CALLBACKS]
    assert names == ["monitor.AttentionMonitor", "training.memory.ReturnFreedMemory"]
    with pytest.raises(SystemExit):
        train.main(["fit", "--print_config"])
    printed = [c["class_path"] for c in yaml.safe_load(capsys.readouterr().out)["trainer"]["callbacks"]]
    assert printed == names
    for config in ("imdb.yaml", "imdb_local.yaml"):
        listed = yaml.safe_load((ROOT / "configs" / config).read_text())["trainer"]["callbacks"]
        assert "training.memory.ReturnFreedMemory" in [c["class_path"] for c in listed], config


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc")
def test_batch_peaks_sees_memory_a_batch_used_and_freed(capsys):
    """BatchPeaks reports a batch's own peak: a 200 MB tensor made and freed inside the batch shows in it."""
    from types import SimpleNamespace

    from bench.scale import BatchPeaks

    peaks = BatchPeaks()
    for index, size in enumerate((0, 50_000_000)):  # floats: none, then 200 MB
        peaks.on_train_batch_start(None, None, None, index)
        if size:
            torch.ones(size).sum()
        peaks.on_train_batch_end(None, None, None, {"input_ids": torch.zeros(2, 3 + index)}, index)
    (first, second) = peaks.rows
    assert second[0] - second[1] >= 150 and first[0] - first[1] < 100
    peaks.on_train_epoch_end(SimpleNamespace(current_epoch=0), None)
    assert "batch 1 2x4" in capsys.readouterr().err.split(";")[0].split(",")[0]
