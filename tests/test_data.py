"""Data sources, tokenizer and batching, on small files the tests write."""

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import NEGATIVE, POSITIVE, ROOT, rows, write
from data.batches import BucketBatchSampler, collate
from data.datamodule import TextDataModule
from data.sources import DataError, load_splits
from data.splitting import stratified_split
from data.tokenizer import PAD_ID, load_tokenizer, train_tokenizer

def splits_of(train_file, **kwargs):
    args = dict(dataset="sst2", data_dir=None, val_file=None, test_file=None, text_column=None, label_column=None,
                val_fraction=0.25, seed=0)
    return load_splits(train_file=str(train_file), **{**args, **kwargs})


@pytest.mark.parametrize("suffix", ["csv", "tsv", "jsonl", "json", "parquet"])
def test_own_files_in_each_format(tmp_path, suffix):
    path = write(tmp_path / f"train.{suffix}", rows())
    splits = splits_of(path)
    assert splits.label_names == ["neg", "pos"]  # string labels become sorted names
    assert len(splits.texts["train"]) + len(splits.texts["validation"]) == 48
    assert set(splits.labels["validation"]) == {0, 1}


def test_integer_labels_stay_and_named_columns(tmp_path):
    path = write(tmp_path / "t.csv", [(t, 1 if y == "pos" else 0) for t, y in rows()], text="review", label="y")
    splits = splits_of(path, text_column="review", label_column="y")
    assert splits.label_names == ["0", "1"]
    index = splits.texts["train"].index("superb")
    assert splits.labels["train"][index] == 1


def test_stratified_split_is_deterministic_and_stratified():
    labels = [0] * 80 + [1] * 20
    train, val = stratified_split(labels, 0.1, seed=3)
    assert stratified_split(labels, 0.1, seed=3) == (train, val)
    assert stratified_split(labels, 0.1, seed=4) != (train, val)
    assert sorted(labels[i] for i in val) == [0] * 8 + [1] * 2
    assert set(train).isdisjoint(val) and len(train) + len(val) == 100


def test_missing_file_and_missing_column_name_the_file(tmp_path):
    with pytest.raises(DataError, match="nope.csv: file not found"):
        splits_of(tmp_path / "nope.csv")
    path = write(tmp_path / "t.csv", rows(), text="sentence")
    with pytest.raises(DataError, match=r"t\.csv: no column 'text'; columns found: sentence, label"):
        splits_of(path)


def test_empty_texts_are_skipped_with_a_count(tmp_path, caplog):
    path = write(tmp_path / "t.jsonl", rows() + [("   ", "pos"), ("", "neg")])
    splits = splits_of(path)
    assert len(splits.texts["train"]) + len(splits.texts["validation"]) == 48
    assert "skipped 2 empty" in caplog.text
    with pytest.raises(DataError, match="no non-empty texts"):
        splits_of(write(tmp_path / "empty.jsonl", [(" ", "pos")]))


def test_label_unseen_in_training_is_an_error(tmp_path):
    train = write(tmp_path / "train.csv", rows())
    val = write(tmp_path / "val.csv", [("so so", "meh"), ("great", "pos")])
    with pytest.raises(DataError, match=r"val\.csv: label\(s\) meh not seen in training \(training labels: neg, pos\)"):
        splits_of(train, val_file=str(val))


def test_non_utf8_bytes_name_the_file(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("text,label\ncaf\xe9 au lait,pos\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"latin1\.csv: not valid UTF-8 \(byte 14"):
        splits_of(path)


def test_unknown_dataset_and_bad_val_fraction(tmp_path):
    with pytest.raises(DataError, match="unknown dataset 'sst3'"):
        load_splits(dataset="sst3", data_dir=None, train_file=None, val_file=None, test_file=None,
                    text_column=None, label_column=None, val_fraction=0.1, seed=0)
    with pytest.raises(DataError, match="val_fraction"):
        TextDataModule(val_fraction=1.5)


def test_registered_dataset_without_hub_copy_says_so(monkeypatch):
    monkeypatch.delenv("ATTENTION_DATA_ROOT", raising=False)
    with pytest.raises(DataError, match="chnsenticorp_htl.*has no hub copy: give data_dir"):
        load_splits(dataset="chnsenticorp_htl", data_dir=None, train_file=None, val_file=None, test_file=None,
                    text_column=None, label_column=None, val_fraction=0.1, seed=0)


def test_local_copy_of_a_registered_dataset(tmp_path, monkeypatch):
    folder = tmp_path / "sst2"
    folder.mkdir()
    write(folder / "train.tsv", [(t, int(y == "pos")) for t, y in rows()], text="sentence")
    write(folder / "validation.tsv", [("great", 1), ("awful", 0)], text="sentence")
    monkeypatch.setenv("ATTENTION_DATA_ROOT", str(tmp_path))
    splits = load_splits(dataset="sst2", data_dir=None, train_file=None, val_file=None, test_file=None,
                         text_column=None, label_column=None, val_fraction=0.1, seed=0)
    assert splits.label_names == ["negative", "positive"]
    assert list(splits.texts["validation"]) == ["great", "awful"] and splits.labels["validation"] == [1, 0]


def local_sst2_copy(tmp_path, monkeypatch):
    """A small SST-2 local copy under ATTENTION_DATA_ROOT (tmp_path/root); returns its folder."""
    folder = tmp_path / "root" / "sst2"
    folder.mkdir(parents=True)
    write(folder / "train.tsv", [(t, int(y == "pos")) for t, y in rows(20)], text="sentence")
    write(folder / "validation.tsv", [("great", 1), ("awful", 0)], text="sentence")
    monkeypatch.setenv("ATTENTION_DATA_ROOT", str(tmp_path / "root"))
    return folder


def test_a_run_records_the_local_copy_it_read_so_later_commands_need_no_variable(tmp_path, monkeypatch):
    folder = local_sst2_copy(tmp_path, monkeypatch)
    data = TextDataModule(dataset="sst2", cache_dir=str(tmp_path / "cache"), vocab_size=40, max_length=8)
    assert data.label_names == ["negative", "positive"]
    assert data.hparams.data_dir == str(folder.resolve())  # what the checkpoint's data settings hold
    monkeypatch.delenv("ATTENTION_DATA_ROOT")
    again = TextDataModule(**{key: data.hparams[key] for key in ("dataset", "data_dir", "vocab_size", "max_length")},
                           cache_dir=str(tmp_path / "cache"))
    assert len(again.split("validation")) == 2


@pytest.mark.slow  # builds train.py's command line
def test_the_runs_config_yaml_records_the_local_copy_it_read(tmp_path, monkeypatch):
    import train
    from conftest import SMOKE

    folder = local_sst2_copy(tmp_path, monkeypatch)
    cli = train.cli(["--config", SMOKE, "--data.dataset", "sst2", "--data.cache_dir", str(tmp_path / "cache")],
                    run=False)
    assert cli.config["data"]["data_dir"] == str(folder.resolve())  # what SaveConfigCallback writes


def test_tokenizer_round_trip_english_and_chinese():
    texts = ["The movie was great, really great!", "a dull, boring film", "酒店的服务很好，房间干净。", "房间很小，服务差"]
    tokenizer = load_tokenizer(train_tokenizer(texts * 3, vocab_size=200, max_length=32).to_str())
    english = tokenizer.encode("the movie was great!")
    assert "[UNK]" not in english.tokens
    assert tokenizer.decode(english.ids) == "the movie was great!"
    chinese = tokenizer.encode("服务很好")
    assert chinese.tokens == ["服", "务", "很", "好"]  # one token per character, not one per sentence
    assert tokenizer.decode(chinese.ids).replace(" ", "") == "服务很好"


def test_very_long_text_is_truncated(tmp_path):
    long_text = " ".join(["great"] * 100_000)
    path = write(tmp_path / "t.csv", rows() + [(long_text, "pos")])
    data = TextDataModule(train_file=str(path), max_length=16, vocab_size=100, cache_dir=str(tmp_path / "cache"))
    assert max(max(data.split(s).lengths) for s in ("train", "validation")) == 16


def test_encoded_once_then_cached(tmp_path, monkeypatch):
    path = write(tmp_path / "t.csv", rows())
    first = TextDataModule(train_file=str(path), vocab_size=100, cache_dir=str(tmp_path / "cache"))
    assert first.label_names == ["neg", "pos"]
    import data.datamodule

    monkeypatch.setattr(data.datamodule, "load_splits", lambda **_: pytest.fail("data was read again"))
    second = TextDataModule(train_file=str(path), vocab_size=100, cache_dir=str(tmp_path / "cache"), batch_size=3)
    assert second.state["tokenizer"] == first.state["tokenizer"]
    assert torch.equal(second.split("train").ids, first.split("train").ids)


def test_a_cache_being_built_does_not_hold_up_other_data(tmp_path):
    """The build lock is per cache file: while one run holds the lock of its data (here: this test, as a run that
    is still encoding), a run on other settings in the same cache folder goes ahead instead of waiting."""
    import fcntl
    import threading

    path = write(tmp_path / "t.csv", rows())
    cache = str(tmp_path / "cache")
    busy = TextDataModule(train_file=str(path), vocab_size=100, max_length=8, cache_dir=cache)
    (tmp_path / "cache").mkdir()
    with open(busy.cache_path().with_suffix(".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        other = TextDataModule(train_file=str(path), vocab_size=100, max_length=16, cache_dir=cache)
        done = threading.Thread(target=lambda: other.state, daemon=True)
        done.start()
        done.join(timeout=60)
        assert not done.is_alive(), "a run on other settings waited for the lock of another cache file"
    assert other.cache_path() != busy.cache_path() and other.cache_path().exists()


def test_batches_hold_ids_mask_labels_and_little_padding(tmp_path):
    path = write(tmp_path / "t.csv", [(" ".join(["great"] * (1 + i % 20)), "pos" if i % 2 else "neg") for i in range(400)])
    data = TextDataModule(train_file=str(path), vocab_size=100, batch_size=16, cache_dir=str(tmp_path / "cache"))
    batches = list(data.train_dataloader())
    assert len(batches) == len(data.train_dataloader())
    batch = batches[0]
    assert batch["input_ids"].dtype == torch.long and batch["labels"].shape == (len(batch["input_ids"]),)
    # In every batch each row holds one text's ids, then padding: the mask's real places are its length.
    for b in batches:
        assert ((~b["padding_mask"]).long().diff(dim=1) <= 0).all()  # real tokens first, padding after
    real = sum((~b["padding_mask"]).sum().item() for b in batches)
    total = sum(b["padding_mask"].numel() for b in batches)
    assert real / total > 0.9  # bucketing: lengths 1..20 at random would give about 55%


def test_bucket_sampler_shards_equally_across_ranks():
    lengths = list(range(103))
    ranks = [BucketBatchSampler(lengths, 10, shuffle=True, seed=1, rank=r, world_size=2).batches() for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 5
    seen = [i for batches in ranks for batch in batches for i in batch]
    assert len(seen) == len(set(seen))


def test_tokenizer_never_outgrows_vocab_size_even_with_many_characters():
    texts = ["".join(chr(0x4E00 + (i * 7 + j) % 3000) for j in range(20)) for i in range(400)]  # ~3000 distinct CJK
    tokenizer = train_tokenizer(texts, vocab_size=500, max_length=32)
    assert tokenizer.get_vocab_size() <= 500
    assert tokenizer.token_to_id("[PAD]") == 0 and tokenizer.token_to_id("[UNK]") == 1


def test_chinese_can_keep_multi_character_words():
    texts = ["酒店的服务很好，房间干净。", "房间很小，服务差。", "服务很好，房间很大。", "房间干净，服务周到。"] * 5
    tokenizer = train_tokenizer(texts, vocab_size=120, max_length=32, split_cjk=False)
    tokens = tokenizer.encode("房间干净，服务很好。").tokens
    assert any(len(token.removeprefix("##")) > 1 for token in tokens)  # learned words, not single characters
    assert len(tokens) > 2  # and not one token per sentence
    assert "".join(t.removeprefix("##") for t in tokens) == "房间干净，服务很好。"


def test_already_tokenized_text_can_keep_its_tokens_whole():
    texts = ["it does n't work", "it 's a charming film", "does n't hold up"] * 3
    split = train_tokenizer(texts, vocab_size=100, max_length=16, kind="word")
    whole = train_tokenizer(texts, vocab_size=100, max_length=16, kind="word", split_punctuation=False)
    assert split.encode("does n't").tokens == ["does", "n", "'", "t"]
    assert whole.encode("does n't").tokens == ["does", "n't"]


def test_bucket_pool_of_one_gives_plain_random_batches():
    lengths = [1 + (i * 7919) % 40 for i in range(2000)]

    def real_share(pool):
        batches = BucketBatchSampler(lengths, 20, shuffle=True, seed=0, pool_batches=pool).batches()
        return sum(lengths[i] for b in batches for i in b) / sum(len(b) * max(lengths[i] for i in b) for b in batches)

    assert real_share(50) > 0.9
    assert real_share(1) < 0.7


TRAIN_IN_A_FRESH_PROCESS = """
import hashlib, json, sys
from data.tokenizer import train_tokenizer
texts, cases = json.loads(sys.stdin.read())
for kwargs in cases:
    print(hashlib.sha256(train_tokenizer(texts, max_length=32, **kwargs).to_str().encode()).hexdigest())
"""
TOKENIZER_CASES = [
    dict(kind="wordpiece", vocab_size=60),
    dict(kind="wordpiece", vocab_size=14, split_cjk=False),  # CJK, an alphabet cut by a small vocab_size
    dict(kind="word", vocab_size=20),
]


@pytest.mark.slow  # a fresh Python process
def test_tokenizer_training_gives_the_same_vocabulary_in_every_process():
    # Hash order differs between processes (not within one), so only fresh processes can show the difference: four,
    # each with its own hash seed, each training every case in turn.
    texts = POSITIVE + NEGATIVE + ["酒店的服务很好，房间干净。", "房间很小，服务差。", "服务很好，房间很大。", "位置不错但是早餐一般"]
    stdin = json.dumps([texts * 3, TOKENIZER_CASES])
    command = [sys.executable, "-c", TRAIN_IN_A_FRESH_PROCESS]
    runs = [subprocess.run(command, input=stdin, capture_output=True, text=True, cwd=ROOT, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout.split() for seed in range(4)]
    assert all(len(run) == len(TOKENIZER_CASES) for run in runs), runs
    for case, kwargs in enumerate(TOKENIZER_CASES):
        assert len({run[case] for run in runs}) == 1, (kwargs, runs)


@pytest.mark.parametrize("kind", ["wordpiece", "word"])
def test_vocab_size_below_the_alphabet_fits_by_dropping_rare_characters(kind):
    texts = ["the quick brown fox jumps over the lazy dog", "pack my box with five dozen liquor jugs"] * 3
    tokenizer = train_tokenizer(texts, vocab_size=12, max_length=16, kind=kind)
    assert tokenizer.get_vocab_size() <= 12
    assert tokenizer.token_to_id("[PAD]") == 0 and tokenizer.token_to_id("[UNK]") == 1
    if kind == "wordpiece":
        assert tokenizer.encode("o").tokens == ["o"]  # the most frequent character is kept


def test_vocab_size_too_small_for_one_character_says_the_smallest_that_works():
    expected = r"^vocab_size 3 cannot hold \[PAD\], \[UNK\] and one character: use at least 4$"
    with pytest.raises(DataError, match=expected):
        train_tokenizer(["hello world"], vocab_size=3, max_length=8)


def test_collate_pads_with_pad_id_and_marks_exactly_the_padding():
    # The first text holds PAD_ID itself ("[PAD]" typed in it): a real token, marked from the lengths, not the ids.
    batch = collate([(torch.tensor([5, PAD_ID, 7]), torch.tensor(1)), (torch.tensor([8]), torch.tensor(0))])
    assert batch["input_ids"].tolist() == [[5, PAD_ID, 7], [8, PAD_ID, PAD_ID]]
    assert batch["padding_mask"].tolist() == [[False, False, False], [False, True, True]]
    assert batch["labels"].tolist() == [1, 0]


@pytest.mark.parametrize("several_labels", [False, True])
def test_a_batch_fetched_whole_equals_the_collated_items(several_labels):
    """EncodedSplit.__getitems__ (what the DataLoader calls for a batch) gives exactly what collate makes of the
    rows' items one by one: ids padded with PAD_ID (a text's own PAD_ID kept), the mask, labels, teacher_probs."""
    import random

    from data.encoded import EncodedSplit

    torch.manual_seed(0)
    lengths = torch.randint(1, 30, (500,))
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    ids = torch.randint(0, 50, (int(offsets[-1]),), dtype=torch.int32)  # PAD_ID (0) among the texts' own ids
    labels = (torch.rand(500, 4) > 0.5).float() if several_labels else torch.randint(0, 3, (500,))
    split = EncodedSplit(ids, offsets, labels, None if several_labels else torch.rand(500, 3))
    rng = random.Random(0)
    for n in (1, 2, 7, 64):
        rows = rng.sample(range(500), n)
        whole, items = split.__getitems__(rows), collate([split[i] for i in rows])
        assert whole.keys() == items.keys()
        for key in whole:
            assert whole[key].dtype == items[key].dtype and torch.equal(whole[key], items[key]), key
    assert collate(whole) is whole
