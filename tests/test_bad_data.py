"""Bad input data: each case is skipped with a counted warning or refused with one line naming the file or setting."""

import pytest

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
    assert "no label here" not in splits.texts["train"] + splits.texts["validation"]
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
    assert "007" in splits.texts["train"] + splits.texts["validation"]  # as written, not 7 and not dropped


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


@pytest.mark.parametrize("name, content", [("train.csv", "text,label\n"), ("train.csv", ""), ("train.tsv", "text\tlabel\n\n\n"),
                                           ("train.jsonl", ""), ("train.json", "[]")])
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
