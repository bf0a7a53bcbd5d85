"""Label and text cells that would otherwise become a class name or a text through str() (docs/BAD_INPUT.md):
nulls, NaN, empty names, nested lists, structs and binary values among the labels, lists or bytes as texts, a
separator for list cells or an empty one; and integer labels named by a labels.txt beside the data."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data.label_encoding import is_missing
from data.sources import DataError, load_splits

TEXTS = ["happy glad", "angry mad", "scared afraid", "angry scared", "glad but afraid", "mad and happy"] * 2


def splits_of(train, label_column="labels", text_column="text", **settings):
    return load_splits(dataset="sst2", data_dir=None, train_file=str(train), val_file=None, test_file=None,
                       text_column=text_column, label_column=label_column, val_fraction=0.3, seed=0, **settings)


def parquet(path, labels, texts=None, label_type=None):
    texts = texts if texts is not None else TEXTS[: len(labels)]
    pq.write_table(pa.table({"text": texts, "labels": pa.array(labels, label_type)}), path)
    return path


def jsonl(path, labels):
    path.write_text("".join(json.dumps({"text": t, "labels": s}) + "\n" for t, s in zip(TEXTS, labels)))
    return path


def refused(path, named=None, **settings) -> str:
    with pytest.raises(DataError) as stop:
        splits_of(path, **settings)
    message = str(stop.value)
    assert "\n" not in message and str(named or path) in message
    return message


SETS = [["joy"], ["anger"], ["fear"], ["anger", "fear"], ["fear", "joy"], ["joy", "anger"]] * 2


@pytest.mark.parametrize("bad, what", [(None, "a null inside a list"), ("  ", "an empty name inside a list")])
def test_a_null_or_empty_name_inside_a_list_of_labels_is_refused_naming_the_rows(tmp_path, bad, what):
    labels = [list(s) for s in SETS]
    labels[2] = ["fear", bad]
    labels[7] = [bad]
    message = refused(jsonl(tmp_path / "t.jsonl", labels))
    assert f"column 'labels', rows 3, 8: {what}" in message and "'None'" not in message


def test_nan_inside_a_list_of_integer_labels_is_refused(tmp_path):
    labels = [[float(i % 3)] for i in range(12)]
    labels[4] = [1.0, float("nan")]
    assert "column 'labels', row 5: NaN inside a list of labels" in refused(parquet(tmp_path / "t.parquet", labels))


def test_nested_lists_and_structs_are_refused_not_made_class_names(tmp_path):
    nested = parquet(tmp_path / "nested.parquet", [[[s[0]]] for s in SETS])
    assert "rows 1, 2, 3, 4, 5 and 7 more: a nested list inside a list of labels" in refused(nested)
    structs = parquet(tmp_path / "struct.parquet", [{"name": s[0], "score": 1} for s in SETS])
    assert "column 'labels', rows 1, 2" in refused(structs) and "structs" in refused(structs)


def test_binary_labels_are_refused(tmp_path):
    path = parquet(tmp_path / "b.parquet", [s[0].encode() for s in SETS], label_type=pa.binary())
    assert "binary values, not labels" in refused(path)


@pytest.mark.parametrize("column, kind", [(pa.array([[t] for t in TEXTS]), "lists"),
                                          (pa.array([t.encode() for t in TEXTS], pa.binary()), "binary values")])
def test_a_text_column_of_lists_or_bytes_is_refused(tmp_path, column, kind):
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"text": column, "labels": [s[0] for s in SETS]}), path)
    assert f"text column 'text' holds {kind}" in refused(path)


def test_a_separator_for_list_cells_is_refused(tmp_path):
    message = refused(parquet(tmp_path / "t.parquet", SETS), label_separator=",")
    assert "lists of labels, and data.label_separator ','" in message and "leave label_separator unset" in message


def test_an_empty_separator_is_refused(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("text,labels\n" + "".join(f'{t},"{",".join(s)}"\n' for t, s in zip(TEXTS, SETS)))
    with pytest.raises(DataError, match="data.label_separator '' is empty"):
        splits_of(path, label_separator="")


def test_an_empty_list_of_label_columns_says_what_was_given(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("text,label\nhappy,pos\nsad,neg\n")
    with pytest.raises(DataError, match=r"data.label_column \[\]: an empty list of columns"):
        splits_of(path, label_column=[])


def test_a_label_name_holding_the_answers_separator_is_refused(tmp_path):
    # An answer joins its labels with ", ": "billing, urgent" would read as two labels.
    labels = [["billing, urgent"], ["billing"], ["urgent", "billing"], ["urgent"]] * 3
    message = refused(jsonl(tmp_path / "t.jsonl", labels))
    assert "label 'billing, urgent' holds ','" in message


def test_a_nan_single_label_is_a_missing_label_not_a_class(tmp_path, caplog):
    labels = [0.0, 1.0, float("nan")] * 4
    with caplog.at_level(logging.WARNING):
        splits = splits_of(parquet(tmp_path / "t.parquet", labels))
    assert splits.label_names == ["0", "1"] and "skipped 4 rows with an empty or missing label" in caplog.text


def test_integer_label_lists_take_their_names_from_labels_txt_beside_them(tmp_path, caplog):
    names = [f"emotion{i}" for i in range(12)]
    (tmp_path / "labels.txt").write_text("\n".join(names) + "\n")
    labels = [[i % 12] + ([10] if i % 3 == 0 else []) for i in range(24)]
    path = parquet(tmp_path / "train.parquet", labels, texts=[f"text {i}" for i in range(24)])
    with caplog.at_level(logging.INFO, logger="data.reading"):
        splits = splits_of(path)
    assert splits.label_names == names  # not '0', '1', '10', '11', '2', ... sorted as strings
    assert f"the 12 lines of {tmp_path / 'labels.txt'}" in caplog.text


def test_a_names_file_flag_names_integer_labels_and_is_checked(tmp_path):
    path = tmp_path / "data" / "train.csv"
    path.parent.mkdir()
    path.write_text("text,label\n" + "".join(f"text {i},{i % 3}\n" for i in range(12)))
    names = tmp_path / "names.txt"
    names.write_text("neg\nneutral\npos\n")
    assert splits_of(path, label_column="label", label_names_file=str(names)).label_names == ["neg", "neutral", "pos"]
    names.write_text("neg\nneutral\n")
    assert "2 label names, but the training labels go up to 2" in refused(path, names, label_column="label",
                                                                             label_names_file=str(names))


def test_a_seeded_fuzzer_over_label_cells_finds_no_traceback_and_no_made_up_name():
    # 10,000 columns of odd cells: each is refused with a LabelError, or read into names that were in the cells.
    import random

    from data import labels

    rng = random.Random(0)
    atoms = [None, float("nan"), float("inf"), 1.5, 2.0, 3, -1, True, "", "  ", "joy", " fear ", "a,b", b"joy",
             {"name": "joy"}]

    def cell(depth=0):
        kind = rng.randrange(4)
        if kind == 0 and depth < 2:
            return [cell(depth + 1) for _ in range(rng.randrange(4))]
        return rng.choice(atoms)

    for _ in range(10_000):
        values = [cell() for _ in range(rng.randint(1, 6))]
        try:
            labels.check_cells(values, "labels")
            kept = [v for v in values if labels.is_set(v) or not is_missing(v)]  # as drop_unusable skips them
            sets = labels.as_sets(kept)
            _, names, _ = labels.encode_sets({"train": sets}, {"train": "f"}, None)
        except labels.LabelError:
            continue
        assert all(name.strip() and name not in ("None", "nan", "inf", "b'joy'") and not name.startswith(("[", "{"))
                   for name in names), (values, names)
