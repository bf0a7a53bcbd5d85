"""Where texts and labels come from: a registered dataset (hub or local copy), the user's own files, or `synthetic`.

Every source is read by `datasets` into a memory-mapped Arrow table, and each split's texts stay there: a TextColumn
(data/columns.py) of the table's text column and the split's row numbers, never a list of Python strings. The labels
are Python lists of integer classes (or of sets of them), plus the label names. Nothing here tokenizes.
Reading a file is data/reading.py's, labels data/label_encoding.py's, the splits data/splitting.py's.
"""

import logging
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from data import labels
from data.errors import DataError
from data.label_encoding import encode_label_sets, encode_labels
from data.reading import SUFFIXES, drop_unusable, integer_label_names, read_table
from data.splitting import Splits, finish_splits
from data.synthetic import synthetic

log = logging.getLogger(__name__)

DATA_ROOT_ENV = "ATTENTION_DATA_ROOT"  # folder holding <dataset name>/ local copies, e.g. ../shared/data


@dataclass(frozen=True)
class RegisteredDataset:
    hub_id: str | None
    text_column: str
    label_column: str
    label_names: list[str] | None = None
    hub_splits: dict[str, str] = field(default_factory=lambda: {"train": "train", "validation": "validation"})
    test_fraction: float | None = None  # one file, no test split: this stratified share is held out as test
    hub_config: str | None = None  # the hub dataset's configuration (go_emotions: "simplified")


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
