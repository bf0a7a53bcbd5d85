"""Bad input data: each case is skipped with a counted warning or refused with one line naming the file or setting."""

import json
import logging
import subprocess
import sys

import pytest
import torch

from conftest import ROOT
from data.sources import DataError, load_splits

GOOD = "".join(f"good film {i},pos\nbad film {i},neg\n" for i in range(6))  # 12 rows, two classes


def csv_file(tmp_path, body, name="train.csv", header="text,label\n"):
    path = tmp_path / name
    path.write_text(header + body, encoding="utf-8")
    return path


def splits_of(train_file, **kwargs):
    args = dict(dataset="sst2", data_dir=None, val_file=None, test_file=None, text_column=None, label_column=None,
                val_fraction=0.25, seed=0)
    return load_splits(train_file=str(train_file), **{**args, **kwargs})


def label_of(splits, text) -> str:
    split = "train" if text in splits.texts["train"] else "validation"
    return splits.label_names[splits.labels[split][splits.texts[split].index(text)]]


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message
    return message


# --- labels ---------------------------------------------------------------------------------------------------------


def test_rows_with_an_empty_label_are_skipped_with_a_count_not_a_class(tmp_path, caplog):
    splits = splits_of(csv_file(tmp_path, GOOD + "no label here,\nnor here,  \n"))
    assert splits.label_names == ["neg", "pos"]
    assert "no label here" not in list(splits.texts["train"]) + list(splits.texts["validation"])
    assert "skipped 2 rows with an empty or missing label of 14" in caplog.text


def test_labels_that_look_like_numbers_but_are_not_plain_integers_stay_text(tmp_path):
    splits = splits_of(csv_file(tmp_path, GOOD.replace(",pos", ",01").replace(",neg", ",10")))
    assert splits.label_names == ["01", "10"]  # two classes, not eleven named 0..10


def test_integer_labels_map_to_consecutive_classes_named_by_their_values(tmp_path):
    splits = splits_of(csv_file(tmp_path, GOOD.replace(",pos", ",2").replace(",neg", ",1")))
    assert splits.label_names == ["1", "2"]  # no unused class 0
    assert label_of(splits, "good film 5") == "2" and label_of(splits, "bad film 5") == "1"


def test_texts_that_are_all_numbers_are_kept_as_text(tmp_path):
    body = "".join(f"{i}{i},pos\n{i}0{i},neg\n" for i in range(1, 7))
    splits = splits_of(csv_file(tmp_path, "007,pos\n" + body))
    assert "007" in list(splits.texts["train"]) + list(splits.texts["validation"])  # as written, not 7 and not dropped


def test_json_numbers_as_texts_are_kept_and_null_labels_skipped(tmp_path, caplog):
    rows = [{"text": 1000 + i, "label": "pos" if i % 2 else "neg"} for i in range(8)] + [{"text": "x", "label": None}]
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    splits = splits_of(path)
    assert sorted(list(splits.texts["train"]) + list(splits.texts["validation"])) == [str(1000 + i) for i in range(8)]
    assert "skipped 1 rows with an empty or missing label of 9" in caplog.text


@pytest.mark.parametrize("body", ["only,pos\n", "a,pos\nb,pos\nc,pos\n"])
def test_a_training_file_with_one_class_is_refused(tmp_path, body):
    with pytest.raises(DataError) as error:
        splits_of(csv_file(tmp_path, body))
    assert one_line(error).startswith(f"{tmp_path / 'train.csv'}: needs at least two classes")


def test_a_held_out_validation_split_that_would_be_empty_is_refused(tmp_path):
    with pytest.raises(DataError) as error:
        splits_of(csv_file(tmp_path, "a,pos\nb,neg\n"), val_fraction=0.2)
    assert one_line(error).startswith(f"{tmp_path / 'train.csv'}: val_fraction 0.2 of 2 rows leaves no validation rows")


def test_every_class_keeps_a_training_row_whatever_val_fraction(tmp_path):
    splits = splits_of(csv_file(tmp_path, "a,pos\nb,pos\nc,neg\nd,neg\n"), val_fraction=0.9)
    assert sorted(splits.labels["train"]) == [0, 1] and sorted(splits.labels["validation"]) == [0, 1]


# --- files ----------------------------------------------------------------------------------------------------------


def test_a_directory_as_train_file_says_so(tmp_path):
    with pytest.raises(DataError) as error:
        splits_of(tmp_path)
    assert one_line(error) == f"{tmp_path}: is a directory, not a file"


@pytest.mark.parametrize("name, content", [
    ("train.csv", "text,label\n"), ("train.csv", ""), ("train.tsv", "text\tlabel\n\n\n"), ("train.jsonl", ""), ("train.json", "[ ]\n"),
])
def test_a_file_without_rows_says_no_rows(tmp_path, name, content):
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DataError) as error:
        splits_of(path)
    assert one_line(error).startswith(f"{path}: no rows")


def test_a_parquet_file_without_rows_says_no_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table({"text": pa.array([], pa.string()), "label": pa.array([], pa.int64())}), path)
    with pytest.raises(DataError) as error:
        splits_of(path)
    assert one_line(error) == f"{path}: no rows"


# --- the DataModule: cache, long texts, checkpoints -----------------------------------------------------------------


def datamodule(tmp_path, **kwargs):
    from data.datamodule import TextDataModule

    path = tmp_path / "train.csv"
    if not path.exists():
        csv_file(tmp_path, GOOD * 3)
    return TextDataModule(train_file=str(path), cache_dir=str(tmp_path / "cache"), **{"vocab_size": 40, **kwargs})


def test_one_lock_file_beside_each_cache_file_and_nothing_else(tmp_path):
    datamodule(tmp_path).state, datamodule(tmp_path, vocab_size=30).state  # noqa: B018  (two cache keys)
    cache = tmp_path / "cache"
    caches = {p.stat().st_ino for p in cache.glob("*.pt")}  # each also linked under the sizes it chose
    assert len(caches) == 2
    locked = [p.stem for p in cache.iterdir() if p.suffix == ".lock"]  # <name>.lock beside each cache file
    assert len(locked) == 2 and {(cache / f"{stem}.pt").stat().st_ino for stem in locked} == caches
    assert all(p.suffix in (".lock", ".pt") for p in cache.iterdir())


def test_a_cache_dir_that_cannot_be_written_encodes_in_memory_with_a_warning(tmp_path, caplog):
    from data.datamodule import TextDataModule

    (tmp_path / "blocked").write_text("a file where the cache folder should be")
    cache = tmp_path / "blocked" / "cache"  # a read-only folder would do, but root may write anywhere
    data = TextDataModule(train_file=str(csv_file(tmp_path, GOOD * 3)), vocab_size=40, cache_dir=str(cache))
    assert len(data.split("train")) + len(data.split("validation")) == 36
    assert f"cache_dir {cache} cannot be written" in caplog.text


def test_a_huge_line_is_cut_to_a_character_bound_before_tokenizing(tmp_path):
    from data.datamodule import EncodedSplit
    from data.tokenizer import CHARS_PER_TOKEN_BOUND

    data = datamodule(tmp_path, max_length=8)
    seen = []

    class Recording:
        def encode_batch(self, texts):
            seen.extend(map(len, texts))
            return data.tokenizer.encode_batch(texts)

    split = EncodedSplit.encode(Recording(), ["good film " * 100_000, "bad"], [0, 1], max_length=8)
    assert max(seen) == 8 * CHARS_PER_TOKEN_BOUND
    assert split.lengths == [8, 1]  # still max_length tokens: the cut lost only what truncation drops


def test_a_checkpoint_with_another_tokenizer_has_the_data_encoded_with_it(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="data.datamodule")
    trained = datamodule(tmp_path, tokenizer="word")
    data = datamodule(tmp_path)  # the same data, another tokenizer
    assert data.state["tokenizer"] != trained.state["tokenizer"]
    data.load_state_dict(trained.state_dict())
    assert data.tokenizer.to_str() == trained.state["tokenizer"]
    for split in ("train", "validation"):
        assert torch.equal(data.split(split).ids, trained.split(split).ids)
    assert "encoding them with the checkpoint's" in caplog.text


def test_lightning_restores_the_tokenizer_before_it_builds_the_loaders(tmp_path):
    import lightning as L

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen = []

        def validation_step(self, batch, batch_idx):
            self.seen.append(batch["input_ids"])

    trained = datamodule(tmp_path, tokenizer="word", batch_size=100)
    model = Recorder()
    checkpoint = tmp_path / "word.ckpt"
    torch.save({"state_dict": model.state_dict(), "pytorch-lightning_version": L.__version__,
                "TextDataModule": trained.state_dict()}, checkpoint)
    trainer = L.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.validate(model, datamodule=datamodule(tmp_path, batch_size=100), ckpt_path=checkpoint, verbose=False)
    expected = next(iter(trained.val_dataloader()))["input_ids"]
    assert len(model.seen) == 1 and torch.equal(model.seen[0], expected)


# --- predict.py: inputs and outputs ---------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def checkpoint(smoke_run):
    """The session's smoke checkpoint (tests/conftest.py); how well it predicts is beside the point."""
    return smoke_run.last


def predict_cli(capsys, *args) -> tuple[int, list[dict], str]:
    import predict

    code = predict.main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.split("\n") if line], err  # JSON may hold U+2028 as it is


@pytest.mark.slow
def test_only_newline_ends_a_line_of_input(checkpoint, tmp_path, capsys):
    path = tmp_path / "texts.txt"
    path.write_bytes(b"alpha w1\rbeta\r\nw2\x0bw3 \xe2\x80\xa8 w4\x1c\nbeta w5 alpha")  # \r\n, lone \r, \v, U+2028, \x1c
    code, outputs, _ = predict_cli(capsys, "--ckpt", checkpoint, "--file", path)
    assert code == 0
    assert [o["text"] for o in outputs] == ["alpha w1\rbeta", "w2\x0bw3 \u2028 w4\x1c", "beta w5 alpha"]


@pytest.mark.slow  # a fresh Python process
def test_closed_standard_input_is_a_one_line_error(checkpoint):
    result = subprocess.run(["bash", "-c", f'exec "{sys.executable}" predict.py --ckpt "{checkpoint}" --file - <&-'],
                            capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "error: --file -: standard input is closed; give texts as arguments or --file PATH\n"


def test_broken_weights_give_an_error_per_text_never_nan_in_the_json(checkpoint, tmp_path, capsys):
    import predict
    from inference.answers import NON_FINITE

    state = torch.load(checkpoint, weights_only=True)
    state["state_dict"] = {name: torch.full_like(value, float("nan")) if value.is_floating_point() else value
                           for name, value in state["state_dict"].items()}
    broken = tmp_path / "nan.ckpt"
    torch.save(state, broken)
    code, outputs, err = predict_cli(capsys, "--ckpt", broken, "alpha w1 beta", "   ")
    assert code == 0
    assert outputs == [{"text": "alpha w1 beta", "error": NON_FINITE}, {"text": "   ", "error": "empty text"}]
    assert "1 input(s) reported as errors" in err


@pytest.mark.parametrize("option, value", [("batch_size", 10**7), ("vocab_size", 10**9)])
def test_data_sizes_are_bounded(option, value):
    from data import DataError
    from data.datamodule import TextDataModule

    with pytest.raises(DataError, match=f"data.{option} {value} is larger than"):
        TextDataModule(dataset="synthetic", **{option: value})
    with pytest.raises(DataError, match=r"data.num_workers must be in 0\.\.\d+, got 100000"):
        TextDataModule(dataset="synthetic", num_workers=100000)


def test_labels_that_differ_only_by_surrounding_spaces_are_one_class(tmp_path, caplog):
    path = csv_file(tmp_path, "".join(f"good film {i},pos\ngood one {i}, pos \nbad film {i},neg \n" for i in range(6)))
    splits = splits_of(path)
    assert splits.label_names == ["neg", "pos"]
    assert "removed the spaces around 12 of 18 labels (e.g. ' pos ' → 'pos')" in caplog.text


def test_an_unreadable_cache_names_the_reason(tmp_path, caplog):
    data = datamodule(tmp_path)
    path = data.cache_path()
    data.state  # noqa: B018  (writes the cache)
    path.write_bytes(b"")
    datamodule(tmp_path).state  # noqa: B018
    assert "unreadable cache (EOFError" in caplog.text or "unreadable cache (RuntimeError: " in caplog.text
    assert "unreadable cache ()" not in caplog.text


def test_the_emoji_only_teacher_hint_names_both_settings():
    from data import DataError
    from training.ngram_teacher import out_of_fold_probabilities

    with pytest.raises(DataError, match=r"--data.teacher null --model.distillation 0"):
        out_of_fold_probabilities(["🙂🙂", "🙁", "🙂", "🙁🙁"] * 5, [1, 0, 1, 0] * 5, 2, seed=0,
                                  source="emoji.csv")


def test_swapped_text_and_label_columns_are_named_not_val_fraction(tmp_path):
    swapped = csv_file(tmp_path, GOOD, header="label,text\n")  # the texts sit under "label"
    with pytest.raises(DataError) as error:
        splits_of(swapped)
    message = one_line(error)
    assert "label column 'label' holds 12 different values in 12 rows" in message and "val_fraction" not in message
    assert "text_column and label_column" in message
    many_classes = "".join(f"text {i},class{i % 6}\n" for i in range(12))  # six classes of two rows: a dataset
    assert len(splits_of(csv_file(tmp_path, many_classes), val_fraction=0.5).label_names) == 6
