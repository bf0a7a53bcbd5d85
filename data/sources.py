"""Where texts and labels come from: a registered dataset (hub or local copy), the user's own files, or `synthetic`.

Every source is read by `datasets` into a memory-mapped Arrow table, and each split's texts stay there: a TextColumn
(data/columns.py) of the table's text column and the split's row numbers, never a list of Python strings. The labels
are Python lists of integer classes (or of sets of them), plus the label names. Nothing here tokenizes.
"""

import codecs
import json
import logging
import os
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from data import labels

if TYPE_CHECKING:  # pyarrow is imported where a file is read: the faces read has_text here before anything heavy
    from data.columns import TextColumn

log = logging.getLogger(__name__)

DATA_ROOT_ENV = "ATTENTION_DATA_ROOT"  # folder holding <dataset name>/ local copies, e.g. ../shared/data
LABEL_NAMES_FILE = "labels.txt"  # beside a training file of integer labels: the names, one a line, in index order
SUFFIXES = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


class DataError(ValueError):
    """Bad input data; its message is one line naming the file and what is wrong."""


@dataclass(frozen=True)
class RegisteredDataset:
    hub_id: str | None
    text_column: str
    label_column: str
    label_names: list[str] | None = None
    hub_splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "validation": "validation"})
    test_fraction: float | None = None  # one file, no test split: this stratified share is held out as test
    hub_config: str | None = None  # the hub dataset's configuration (go_emotions: "simplified")


# The fixed test split of a dataset with test_fraction: its own seed, independent of data.seed and val_fraction, so
# every run scores the same held-out texts. 14, not data.seed's default 0: the
# shipped configs were tuned on the validation rows seed 0 draws, so the test rows are drawn apart from them.
TEST_SPLIT_SEED = 14


REGISTRY = {
    "sst2": RegisteredDataset("stanfordnlp/sst2", "sentence", "label", ["negative", "positive"]),
    # No hub copy with a fixed layout: a local all.csv, split here (stratified, deterministic): 10% test (fixed),
    # then val_fraction of the rest as validation (by data.seed).
    "chnsenticorp_htl": RegisteredDataset(None, "review", "label", ["negative", "positive"], test_fraction=0.1),
    "ag_news": RegisteredDataset(
        "fancyzhx/ag_news", "text", "label", ["World", "Sports", "Business", "Sci/Tech"], {"train": "train", "test": "test"}
    ),
    "imdb": RegisteredDataset("stanfordnlp/imdb", "text", "label", ["negative", "positive"], {"train": "train", "test": "test"}),
    # Several labels a text: a column of lists of indices into these names (the local copy's labels.txt).
    "goemotions": RegisteredDataset(
        "google-research-datasets/go_emotions", "text", "labels",
        ["admiration", "amusement", "anger", "annoyance", "approval", "caring", "confusion", "curiosity", "desire",
         "disappointment", "disapproval", "disgust", "embarrassment", "excitement", "fear", "gratitude", "grief", "joy",
         "love", "nervousness", "optimism", "pride", "realization", "relief", "remorse", "sadness", "surprise",
         "neutral"],
        {"train": "train", "validation": "validation", "test": "test"}, hub_config="simplified",
    ),
}
NAMES = sorted(REGISTRY) + ["synthetic"]


@dataclass
class Splits:
    texts: dict[str, "TextColumn"]  # or lists: any sequence of texts
    labels: dict[str, list[int]]
    label_names: list[str]
    sources: dict[str, str] = field(default_factory=dict)  # split → the file (or hub split) it came from
    multi_label: bool = False  # labels[split] then holds a list of class indices per text (data/labels.py)


def local_copy_dir(name: str, data_dir: str | None) -> Path | None:
    """The folder of a local copy: `data_dir` if given, else $ATTENTION_DATA_ROOT/<name> if it exists."""
    if data_dir:
        path = Path(data_dir).expanduser()
        if not path.is_dir():
            raise DataError(f"{path}: data_dir is not a folder")
        return path
    root = os.environ.get(DATA_ROOT_ENV)
    if root and (Path(root) / name).is_dir():
        return Path(root) / name
    return None


def split_files(folder: Path) -> dict[str, Path]:
    """train.* / validation.* / test.* / all.* files of a local copy, any supported suffix."""
    found = {}
    for split in ("train", "validation", "test", "all"):
        for suffix in SUFFIXES:
            if (folder / f"{split}{suffix}").is_file():
                found[split] = folder / f"{split}{suffix}"
                break
    if "train" not in found and "all" not in found:
        raise DataError(f"{folder}: no train.* or all.* file ({', '.join(SUFFIXES)}) in this local copy")
    return found


def check_utf8(path: Path) -> None:
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                raise DataError(f"{path}: not valid UTF-8 (byte {offset + e.start}: {e.reason}); save it as UTF-8") from None
            offset += len(chunk)
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not valid UTF-8 (truncated character at the end); save it as UTF-8") from None


def read_table(path: Path, text_column: str, label_column: str | list[str] | None) -> tuple["TextColumn", list | None]:
    """Texts and raw labels (None when label_column is None) of one CSV/TSV/JSON/JSONL/parquet file, read with
    `datasets` into its memory-mapped Arrow cache. A list of label columns is one 0/1 column per label: each row's
    labels are the set of the columns holding 1 (data/labels.py).

    CSV/TSV cells of the two columns are read as the file's own text: pandas would otherwise read a column of
    numbers as numbers ("007" → 7, a text "42" → 42) and the labels "01", "10" as 1 and 10. JSON and parquet keep
    the types the file gives them."""
    import datasets

    from data.columns import TextColumn

    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a file")
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    builder = SUFFIXES.get(path.suffix.lower())
    if builder is None:
        raise DataError(f"{path}: unsupported file type {path.suffix!r} (use {', '.join(SUFFIXES)})")
    if builder != "parquet":
        check_utf8(path)
    if not has_rows(path, builder):  # `datasets` fails on each empty format with a different riddle
        raise DataError(f"{path}: no rows" + (" (a header only, or an empty file)" if builder == "csv" else ""))
    kwargs = {"delimiter": "\t"} if path.suffix.lower() == ".tsv" else {}
    label_columns = [label_column] if isinstance(label_column, str) else list(label_column or [])
    if builder == "csv":
        kwargs["keep_default_na"] = False  # a text "NA" or "null" stays text
        columns = [text_column] + label_columns
        kwargs["converters"] = {column: str for column in columns}  # cells as written, never parsed as numbers
    try:
        table = datasets.load_dataset(builder, data_files=str(path), split="train", **kwargs)
    except Exception as e:  # datasets wraps parser errors several layers deep; report the innermost
        if builder == "json" and (line := first_bad_json_line(path)) is not None:
            raise DataError(f"{path}: {line}") from None
        while e.__cause__ is not None or e.__context__ is not None:
            e = e.__cause__ or e.__context__
        raise DataError(f"{path}: could not be read as {path.suffix} ({type(e).__name__}: {str(e).splitlines()[0]})") from None
    for column in (text_column, *label_columns):
        if column and column not in table.column_names:
            raise DataError(f"{path}: no column {column!r}; columns found: {', '.join(table.column_names)}")
    if table.num_rows == 0:
        raise DataError(f"{path}: no rows")
    check_text_type(path, text_column, table.data.column(text_column).type)
    texts = TextColumn(table.data.column(text_column))
    if isinstance(label_column, str) or not label_columns:
        return texts, table.data.column(label_column).to_pylist() if label_column else None
    try:
        columns = {column: table.data.column(column).to_pylist() for column in label_columns}
        return texts, labels.from_indicator_columns(columns)
    except labels.LabelError as e:
        raise DataError(f"{path}: {e}") from None


def check_text_type(path: Path, column: str, arrow_type) -> None:
    """Texts are strings (numbers read as texts too: data/columns.py); a column of lists, records or bytes would be
    trained on as its Python repr, so it is refused."""
    import pyarrow as pa

    kinds = ((pa.types.is_binary, "binary values"), (pa.types.is_large_binary, "binary values"),
             (pa.types.is_fixed_size_binary, "binary values"), (pa.types.is_list, "lists"),
             (pa.types.is_large_list, "lists"), (pa.types.is_fixed_size_list, "lists"), (pa.types.is_struct, "structs"),
             (pa.types.is_map, "maps"))
    for test, kind in kinds:
        if test(arrow_type):
            raise DataError(f"{path}: text column {column!r} holds {kind} ({arrow_type}), not texts; name the column "
                            "of texts with text_column")


def read_unlabeled(path, text_column: str = "text") -> list[str]:
    """The non-empty texts of an unlabeled file, for pretraining: one text per line of a plain text file (any other
    suffix than the table formats), or per row of a CSV/TSV/JSON/JSONL/parquet file's `text_column`."""
    path = Path(path)
    if path.suffix.lower() in SUFFIXES:
        texts, _ = read_table(path, text_column, None)
    else:
        if path.is_dir():
            raise DataError(f"{path}: is a directory, not a file")
        if not path.is_file():
            raise DataError(f"{path}: file not found")
        check_utf8(path)
        texts = path.read_text(encoding="utf-8").splitlines()
    kept = [text for text in texts if has_text(text)]
    if not kept:
        where = f" in column {text_column!r}" if path.suffix.lower() in SUFFIXES else ""
        raise DataError(f"{path}: no non-empty texts{where}")
    if len(kept) < len(texts):
        log.warning("%s: skipped %d empty or whitespace-only texts of %d", path, len(texts) - len(kept), len(texts))
    return kept


def first_bad_json_line(path: Path) -> str | None:
    """Which line of a JSON-lines file is not JSON, and why; None for a file of JSON lines (or one JSON document).
    Arrow's reader counts rows within the block it was reading, so its row number misleads past the first block."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if number == 1 and line.lstrip().startswith("["):  # one JSON document, not one a line
                return None
            if line.strip():
                try:
                    json.loads(line.rstrip())
                except json.JSONDecodeError as e:
                    return f"line {number} is not valid JSON ({e.msg} at column {e.colno})"
    return None


def has_rows(path: Path, builder: str) -> bool:
    """Whether the file holds anything past a CSV header (or, for JSON, past an empty list)."""
    if builder == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(path).metadata.num_rows > 0
        except Exception:  # not parquet at all: `datasets` reports it
            return True
    with open(path, encoding="utf-8") as f:
        if builder == "csv":
            f.readline()
        rest = f.read(1 << 16).strip()
        while rest == "" and (chunk := f.read(1 << 20)):  # blank lines, however many
            rest = chunk.strip()
    return "".join(rest.split()) not in ("", "[]")


def drop_unusable(texts: "TextColumn", labels: list, where: str) -> tuple["TextColumn", list]:
    """Rows without a text (empty, whitespace-only or missing) or without a label (an empty cell or a missing
    value) give nothing to learn from or score against: they are skipped, with a warning that counts each kind.
    Numbers in a text column (JSON, parquet) are texts too: 42 becomes "42". Text labels lose surrounding
    whitespace (strip_labels)."""
    readable = [has_text(text) for text in texts]  # read a chunk at a time
    keep = [i for i, label in enumerate(labels) if readable[i] and not is_missing(label)]
    if not all(readable):
        log.warning("%s: skipped %d empty or whitespace-only texts of %d", where, readable.count(False), len(texts))
    if sum(readable) > len(keep):
        unlabelled = sum(readable) - len(keep)
        log.warning("%s: skipped %d rows with an empty or missing label of %d", where, unlabelled, len(texts))
    if not any(readable):
        raise DataError(f"{where}: no non-empty texts")
    if not keep:
        raise DataError(f"{where}: no row has a label")
    return texts.take(keep), strip_labels([labels[i] for i in keep], where)


def strip_labels(labels: list, where: str) -> list:
    """Text labels without surrounding whitespace: "pos", " pos " and "pos " are one class, not three (a CSV
    written with spaces after the commas). How many were changed goes to a warning."""
    stripped = [label.strip() if isinstance(label, str) else label for label in labels]
    changed = [(a, b) for a, b in zip(labels, stripped) if a != b]
    if changed:
        log.warning("%s: removed the spaces around %d of %d labels (e.g. %r → %r)", where, len(changed), len(labels),
                    *changed[0])
    return stripped


def has_text(text: str | None) -> bool:
    """The one rule on empty texts: missing, empty or whitespace-only is no text to learn from or classify (the
    data skip it, predict.py and serve.py answer it with an error, the head tools and benches leave it out)."""
    return text is not None and text.strip() != ""


def is_missing(label) -> bool:
    """None, NaN (a parquet/JSON float column's missing value) or an empty text."""
    return label is None or (isinstance(label, float) and label != label) or (isinstance(label, str) and not label.strip())


def is_integer(label) -> bool:
    """An integer, an integral float, or a text that is a plain integer ("3", "-1"; not "01", "+3" or "3.0")."""
    if isinstance(label, bool):
        return False
    if isinstance(label, float):
        return label.is_integer()
    return isinstance(label, int) or (isinstance(label, str) and re.fullmatch(r"-?(0|[1-9][0-9]*)", label) is not None)


def encode_labels(raw: dict[str, list], sources: dict[str, str], names: list[str] | None) -> tuple[dict[str, list[int]], list[str]]:
    """Raw labels → class indices 0..n-1, and the label names.

    Integer labels (see is_integer): if the registered dataset names its classes and every training label indexes
    those names, the label is the class. Otherwise the sorted distinct training labels become 0..n-1 and keep their
    values as names, so labels {1, 2} give classes named "1", "2" and no unused class 0. Any other labels are texts,
    kept as written, and their sorted distinct values are the names: "01" and "10" are two classes, not 1 and 10."""
    train = raw["train"]
    if all(is_integer(label) for label in train):
        values = sorted({int(label) for label in train})
        if names and all(0 <= value < len(names) for value in values):  # registered names: the label is the class
            to_index = {i: i for i in range(len(names))}
        else:
            names = [str(value) for value in values]
            to_index = {value: i for i, value in enumerate(values)}

        def key(label):
            return int(label) if is_integer(label) else None
    else:
        names = sorted({str(label) for label in train})
        to_index = {name: i for i, name in enumerate(names)}
        key = str
    encoded = {}
    for split, labels in raw.items():
        encoded[split] = [to_index.get(key(label)) for label in labels]
        if None in encoded[split]:
            unseen = sorted({str(label) for label, index in zip(labels, encoded[split]) if index is None})
            raise DataError(
                f"{sources[split]}: label(s) {', '.join(unseen[:5])} not seen in training (training labels: {', '.join(names)})"
            )
    return encoded, names


def stratified_split(labels: list[int], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Indices (train, validation): `fraction` of each class goes to validation, the same for the same seed.
    A class of one row stays in train, and every class keeps at least one training row.
    Not sklearn's train_test_split(stratify=): it draws other rows and rounds each class's share otherwise (777 test
    rows of ChnSentiCorp instead of 776, 75 in common), so the held-out test set, the data cache and every
    published ChnSentiCorp figure would move; it also refuses a class of one row."""
    rng = random.Random(seed)
    train, val = [], []
    for cls in sorted(set(labels)):
        members = [i for i, label in enumerate(labels) if label == cls]
        rng.shuffle(members)
        n_val = min(len(members) - 1, max(1, round(len(members) * fraction)))
        val += members[:n_val]
        train += members[n_val:]
    return sorted(train), sorted(val)


def synthetic(n: int = 4000, seed: int = 0, vocab: int = 30, min_len: int = 6, max_len: int = 16) -> dict[str, tuple]:
    """Label = which marker comes first ("alpha" before "beta" → 1): only attention between positions solves it;
    a bag of words sees the same two markers either way."""
    from data.columns import TextColumn

    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        words = [f"w{rng.randrange(vocab)}" for _ in range(rng.randint(min_len, max_len))]
        i, j = sorted(rng.sample(range(len(words) + 2), 2))
        first, second = ("alpha", "beta") if rng.random() < 0.5 else ("beta", "alpha")
        words.insert(i, first)
        words.insert(j, second)
        texts.append(" ".join(words))
        labels.append(int(first == "alpha"))
    return {"all": (TextColumn(texts), labels)}


def load_splits(
    *,
    dataset: str,
    data_dir: str | None,
    train_file: str | None,
    val_file: str | None,
    test_file: str | None,
    text_column: str | None,
    label_column: str | list[str] | None,
    val_fraction: float,
    seed: int,
    label_separator: str | None = None,
    label_names_file: str | None = None,
) -> Splits:
    names, test_fraction = None, None
    if label_separator == "":
        raise DataError("data.label_separator '' is empty: give the text between labels (',' for 'anger,fear'), or "
                        "leave it unset")
    if isinstance(label_column, (list, tuple)) and not label_column:
        raise DataError("data.label_column []: an empty list of columns; give the label column's name, or one 0/1 "
                        "column per label ([anger, fear])")
    if train_file:
        files = {"train": Path(train_file), "validation": val_file and Path(val_file), "test": test_file and Path(test_file)}
        files = {split: path for split, path in files.items() if path}
        text_column, label_column = text_column or "text", label_column or "label"
        raw = {split: read_table(path, text_column, label_column) for split, path in files.items()}
        sources = {split: str(path) for split, path in files.items()}
    elif dataset == "synthetic":
        raw, sources = synthetic(seed=seed), {"all": "synthetic"}
    elif dataset in REGISTRY:
        spec = REGISTRY[dataset]
        test_fraction = spec.test_fraction
        names, text_column, label_column = spec.label_names, text_column or spec.text_column, label_column or spec.label_column
        folder = local_copy_dir(dataset, data_dir)
        if folder is not None:
            files = split_files(folder)
            raw = {split: read_table(path, text_column, label_column) for split, path in files.items()}
            sources = {split: str(path) for split, path in files.items()}
        else:
            raw, sources = load_from_hub(dataset, spec, text_column, label_column)
    else:
        raise DataError(f"unknown dataset {dataset!r}; registered: {', '.join(NAMES)} (or give train_file)")

    if isinstance(label_column, str):  # (0/1 columns were read into sets of their names already)
        for split, (_, values) in raw.items():
            try:
                labels.check_cells(values, label_column, label_separator)
            except labels.LabelError as e:
                raise DataError(f"{sources[split]}: {e}") from None
    if label_separator:
        raw = {split: (texts, labels.split_delimited(values, label_separator)) for split, (texts, values) in raw.items()}
    raw = {split: drop_unusable(*pair, where=sources[split]) for split, pair in raw.items()}
    if "all" in raw:  # one file: train is split off below
        raw["train"], sources["train"] = raw.pop("all"), sources.pop("all")
    if train_file or label_names_file:
        names = integer_label_names(raw["train"][1], label_names_file, Path(train_file) if train_file else None) or names
    multi_label = bool(label_separator) or any(labels.is_set(value) for value in raw["train"][1])
    if multi_label:
        label_sets, label_names, texts = encode_label_sets(raw, sources, names, label_separator)
        if all(len(indices) == 1 for indices in label_sets["train"]):
            log.info("%s: every training text has exactly one label: one class a text (softmax)", sources["train"])
            label_sets = {split: [s[0] if len(s) == 1 else None for s in sets] for split, sets in label_sets.items()}
            multi_label = False
            for split, sets in list(label_sets.items()):  # a validation/test text of several labels cannot be scored
                if None in sets:
                    log.warning("%s: skipped %d text(s) with other than one label (training has one a text)",
                                sources[split], sets.count(None))
                    texts[split] = texts[split].take([i for i, s in enumerate(sets) if s is not None])
                    label_sets[split] = [s for s in sets if s is not None]
        return finish_splits(texts, label_sets, label_names, sources, test_fraction, val_fraction, seed, multi_label)
    encoded, label_names = encode_labels({s: pair[1] for s, pair in raw.items()}, sources, names)
    texts = {split: pair[0] for split, pair in raw.items()}
    classes = sorted(set(encoded["train"]))
    once = [cls for cls, count in Counter(encoded["train"]).items() if count == 1]
    if names is None and len(once) > max(2, len(encoded["train"]) / 2):  # no split could validate such classes
        raise DataError(
            f"{sources['train']}: the label column {label_column!r} holds {len(classes)} different values in "
            f"{len(encoded['train'])} rows, most of them once (such as {label_names[once[0]][:40]!r}): is it the text? "
            f"Name the columns with text_column and label_column (now {text_column!r} and {label_column!r})"
        )
    return finish_splits(texts, encoded, label_names, sources, test_fraction, val_fraction, seed, False)


def encode_label_sets(raw: dict, sources: dict[str, str], names: list[str] | None, separator: str | None = None):
    """Sets of labels a text (data/labels.py) → (class indices a text per split, label names, texts per split)."""
    try:
        encoded, label_names, keep = labels.encode_sets({s: labels.as_sets(pair[1]) for s, pair in raw.items()},
                                                        sources, names)
        if not all(len(indices) == 1 for indices in encoded["train"]):  # answers join several labels
            labels.check_names_separable(label_names, separator)
    except labels.LabelError as e:
        raise DataError(f"{sources['train']}: {e}" if str(e).startswith("label ") else str(e)) from None
    texts = {split: raw[split][0].take(keep[split]) for split in raw}
    return encoded, label_names, texts


def integer_label_names(train_labels: list, names_file: str | None, train_file: Path | None) -> list[str] | None:
    """The names of integer labels (or lists of them): read from `names_file` (data.label_names_file) or, when none
    is given, from a labels.txt beside the training file (the hub's layout: one name a line, in index order); None
    when the labels are not integers or there is no such file. Every label must index a line."""
    values = [v for label in train_labels for v in (label if labels.is_set(label) else [label])]
    integers = bool(values) and all(is_integer(v) for v in values)
    if names_file is None:
        beside = train_file.parent / LABEL_NAMES_FILE if train_file is not None else None
        if not integers or beside is None or not beside.is_file():
            return None
        path = beside
    else:
        path = Path(names_file)
        if not integers:
            example = next(v for v in values if not is_integer(v)) if values else None
            raise DataError(f"data.label_names_file {names_file}: the labels are not integers indexing its lines "
                            f"(such as {example!r}); leave label_names_file unset")
    if not path.is_file():
        raise DataError(f"{path}: file not found (data.label_names_file)")
    check_utf8(path)
    names = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise DataError(f"{path}: label name {repeated[0]!r} on more than one line; one name a line, each once")
    largest = max(int(v) for v in values)
    if min(int(v) for v in values) < 0 or largest >= len(names):
        raise DataError(f"{path}: {len(names)} label names, but the training labels go up to {largest} (from 0, one "
                        "name a line)" + ("" if names_file else "; give the right data.label_names_file or move it"))
    log.info("label names: the %d lines of %s (the integer labels index them)", len(names), path)
    return names


def finish_splits(texts, labels, label_names, sources, test_fraction, val_fraction, seed, multi_label) -> Splits:
    """Checks, then the test and validation splits held out of train where the data have none."""
    def strata(ls):  # multi-label: stratified by each text's first label (-1: none)
        return [(s[0] if s else -1) for s in ls] if multi_label else ls

    classes = sorted({c for s in labels["train"] for c in s}) if multi_label else sorted(set(labels["train"]))
    if len(classes) < 2:
        raise DataError(
            f"{sources['train']}: needs at least two classes to learn from; "
            f"all {len(labels['train'])} usable row(s) are labelled {label_names[classes[0]]!r}"
        )
    if "test" not in texts and test_fraction:
        rest, test_idx = stratified_split(strata(labels["train"]), test_fraction, TEST_SPLIT_SEED)
        texts["test"], labels["test"] = texts["train"].take(test_idx), [labels["train"][i] for i in test_idx]
        texts["train"], labels["train"] = texts["train"].take(rest), [labels["train"][i] for i in rest]
        sources["test"] = f"{sources['train']} (held-out test split)"
    if "validation" not in texts:
        train_idx, val_idx = stratified_split(strata(labels["train"]), val_fraction, seed)
        if not val_idx:
            raise DataError(
                f"{sources['train']}: val_fraction {val_fraction} of {len(labels['train'])} rows leaves no validation "
                f"rows (a class gives one only when it has two or more); give val_file, or more rows"
            )
        texts["validation"] = texts["train"].take(val_idx)
        labels["validation"] = [labels["train"][i] for i in val_idx]
        texts["train"] = texts["train"].take(train_idx)
        labels["train"] = [labels["train"][i] for i in train_idx]
        sources["validation"] = f"{sources['train']} (held-out validation split)"
    n_classes = len(classes)
    if len(labels["validation"]) < n_classes and not multi_label:
        # Early stopping and the best checkpoint are chosen on validation accuracy: a few texts cannot choose them.
        raise DataError(
            f"{sources['validation']}: {len(labels['validation'])} validation text(s) for {n_classes} classes; "
            "give at least one per class (a larger val_file or val_fraction)"
        )
    return Splits(texts, labels, label_names, sources, multi_label)


def load_from_hub(name: str, spec: RegisteredDataset, text_column: str, label_column: str):
    if spec.hub_id is None:
        raise DataError(
            f"dataset {name!r} has no hub copy: give data_dir=<folder with all.csv> or set {DATA_ROOT_ENV} to a folder holding {name}/"
        )
    import datasets

    from data.columns import TextColumn

    try:
        hub = datasets.load_dataset(spec.hub_id, spec.hub_config)
    except Exception as e:
        raise DataError(
            f"dataset {name!r}: no local copy (data_dir, or {DATA_ROOT_ENV}/{name}) and the hub ({spec.hub_id}) "
            f"could not be reached: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        ) from None
    raw, sources = {}, {}
    for split, hub_split in spec.hub_splits.items():
        table = hub[hub_split]
        for column in (text_column, label_column):
            if column not in table.column_names:
                raise DataError(f"{spec.hub_id}[{hub_split}]: no column {column!r}; columns found: {', '.join(table.column_names)}")
        raw[split] = (TextColumn(table.data.column(text_column)), table.data.column(label_column).to_pylist())
        sources[split] = f"{spec.hub_id}[{hub_split}]"
    return raw, sources
