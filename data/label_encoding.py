"""Raw label cells → class indices and label names, per split: missing cells, integer labels, sets of labels a
text (data/labels.py's layouts), one line naming the file when they cannot be.
"""

import logging
import re

from data import labels
from data.errors import DataError

log = logging.getLogger(__name__)

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
