"""Labels as users have them: one label a text, or a set of labels a text, in any of the layouts files use.

Pure functions from raw column values to label names and per-text label indices; nothing here reads a file.

Layouts of a set of labels a text (multi-label):
    lists          a parquet/JSON column of lists: ["anger", "fear"], or integers [2, 14] (the hub's go_emotions)
    delimited      a CSV/TSV column of strings cut at data.label_separator: "anger,fear"
    0/1 columns    one column per label (data.label_column [anger, fear, joy]), 1 where the label applies

Rules:
    - The order within a set and repeats mean nothing: "fear,anger" and "anger,fear" are one set.
    - An empty list is a text that none of the labels applies to, a valid answer; an empty cell of a delimited
      column, like any missing label, is a row without a label (skipped, with a warning, data/sources.py).
    - The label names are the training split's; a validation/test label never seen in training cannot be
      predicted, so it is dropped from that text with a warning naming it, and a text left with none of its
      labels (all unknown) is skipped with a warning: its true answer is outside what the model knows.
    - A set column whose training texts all carry exactly one label is single-label: a softmax over the classes.
"""

import logging
import math
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a tensor is made: data.sources reads this module, and the
    import torch  # faces read data.sources before torch is loaded (tests/test_layering.py)

log = logging.getLogger(__name__)

IMBALANCE_RATIO = 3.0  # most / least frequent class at or above this: macro-F1 is monitored, the teacher balanced
# (SST-2 1.3 and ChnSentiCorp 2.2 stay on accuracy; SST-2 with 95% of its positives dropped is 16)


class LabelError(ValueError):
    """Labels that cannot be read as one or several classes a text; the caller names the file."""


def is_set(value) -> bool:
    """A list-like cell: a Python list or tuple, or the numpy array pyarrow hands out for a list column."""
    return isinstance(value, (list, tuple)) or type(value).__name__ == "ndarray"


SHOWN_ROWS = 5  # row numbers named in a message, then how many more
ANSWER_JOINER = ", "  # what joins several labels into an answer's "label" (inference/classifier.py answer)


def check_cells(values: list, column: str, separator: str | None = None) -> None:
    """Refuse label cells that would otherwise become a class name through str(): a null, NaN, an empty name, a
    nested list, a struct or binary inside a list of labels; a struct or binary cell; a list cell where
    `separator` says the cells are delimited text. LabelError names the column, the rows (from 1) and what they
    hold. A missing scalar cell (null, NaN) is not refused here: it is a row without a label (data/sources.py)."""
    problems: dict[str, list[int]] = {}
    for row, value in enumerate(values, 1):
        problem = cell_problem(value, separator)
        if problem:
            problems.setdefault(problem, []).append(row)
    if problems:
        problem, rows = next(iter(problems.items()))
        raise LabelError(f"column {column!r}, {describe_rows(rows)}: {problem}")


def cell_problem(value, separator: str | None) -> str | None:
    if is_set(value):
        if separator:
            return (f"lists of labels, and data.label_separator {separator!r} is for text cells such as "
                    f"'a{separator}b': leave label_separator unset for a column of lists")
        for item in value:
            if (problem := item_problem(item)) is not None:
                return f"{problem} inside a list of labels; give each label as a name or an integer"
        return None
    if isinstance(value, dict):
        return "structs (records of fields), not labels; give the column of the label itself"
    if isinstance(value, (bytes, bytearray)):
        return "binary values, not labels; store the labels as text or integers"
    if isinstance(value, float) and math.isinf(value):
        return "an infinite number, not a label"
    return None


def item_problem(item) -> str | None:
    if item is None:
        return "a null"
    if isinstance(item, float) and not item.is_integer():
        return "NaN" if math.isnan(item) else f"the number {item!r}"
    if is_set(item):
        return "a nested list"
    if isinstance(item, dict):
        return "a struct"
    if isinstance(item, (bytes, bytearray)):
        return "a binary value"
    if isinstance(item, str) and not item.strip():
        return "an empty name"
    return None


def describe_rows(rows: list[int]) -> str:
    shown = ", ".join(map(str, rows[:SHOWN_ROWS]))
    more = f" and {len(rows) - SHOWN_ROWS} more" if len(rows) > SHOWN_ROWS else ""
    return f"row{'s' if len(rows) > 1 else ''} {shown}{more}"


def check_names_separable(names: list[str], separator: str | None) -> None:
    """Several labels a text: no label name may hold the separator in use (the data's label_separator, or the ", "
    that joins an answer's labels): "billing, urgent" would read as two labels."""
    for name in names:
        for cut in filter(None, (separator, ANSWER_JOINER.strip())):
            if cut in name:
                raise LabelError(f"label {name!r} holds {cut!r}, which separates several labels "
                                 f"(an answer's \"label\" joins them with {ANSWER_JOINER!r}); rename the label")


def split_delimited(values: list, separator: str) -> list:
    """Strings cut at `separator` into sets, each name stripped; missing cells (None, empty) stay None."""
    out = []
    for value in values:
        if value is None or (isinstance(value, str) and not value.strip()):
            out.append(None)
        elif isinstance(value, str):
            out.append([part.strip() for part in value.split(separator) if part.strip()])
        else:
            out.append([value])
    return out


def from_indicator_columns(columns: dict[str, list]) -> list[list[str]]:
    """One 0/1 column per label → each row's set of the column names holding 1. Any other cell (2, "yes", an empty
    cell) raises LabelError naming the column and the row."""
    names = list(columns)
    rows = len(next(iter(columns.values())))
    sets = [[] for _ in range(rows)]
    for name in names:
        for row, value in enumerate(columns[name]):
            flag = _flag(value)
            if flag is None:
                raise LabelError(f"column {name!r}, row {row + 1}: {value!r} is not 0 or 1 (one 0/1 column per label)")
            if flag:
                sets[row].append(name)
    return sets


def _flag(value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("0", "1", "0.0", "1.0", "true", "false"):
        return value.strip().lower() in ("1", "1.0", "true")
    return None


def as_sets(values: list) -> list:
    """Each cell as a list (None stays None, a scalar becomes a set of one), numbers as Python ints."""
    out = []
    for value in values:
        if value is None:
            out.append(None)
        elif is_set(value):
            out.append([int(v) if isinstance(v, float) and v.is_integer() else (v.item() if hasattr(v, "item") else v)
                        for v in list(value)])
        else:
            out.append([value])
    return out


def encode_sets(raw: dict[str, list[list]], sources: dict[str, str], names: list[str] | None):
    """Sets of raw labels per split → (sets of class indices per split, label names, rows to keep per split).

    Names: when every training label is an integer indexing the registered `names`, those (the hub's go_emotions
    stores indices); else the sorted distinct training labels as text. Outside training, unknown labels are dropped
    and a text left with none is not kept (module docstring); each is counted in a warning."""
    train = [label for labels in raw["train"] for label in labels]
    if names and train and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < len(names) for v in train):
        to_index = {i: i for i in range(len(names))}

        def key(label):
            return label if isinstance(label, int) else None
    else:
        names = sorted({str(label).strip() for label in train})
        to_index = {name: i for i, name in enumerate(names)}

        def key(label):
            return str(label).strip()
    if not names:
        raise LabelError(f"{sources['train']}: no training text has a label (every label set is empty)")
    encoded, keep = {}, {}
    for split, sets in raw.items():
        unknown, emptied, rows, kept = Counter(), 0, [], []
        for i, labels in enumerate(sets):
            indices = sorted({to_index[key(label)] for label in labels if key(label) in to_index})
            unknown.update(str(label) for label in labels if key(label) not in to_index)
            if labels and not indices:
                emptied += 1
                continue
            rows.append(indices)
            kept.append(i)
        if unknown:
            log.warning("%s: dropped %d label(s) never seen in training (%s); %d text(s) left with no known label "
                        "skipped", sources[split], sum(unknown.values()), ", ".join(sorted(unknown)[:5]), emptied)
        if not rows:
            raise LabelError(f"{sources[split]}: no text has a label seen in training (training labels: "
                             f"{', '.join(names[:10])})")
        encoded[split], keep[split] = rows, kept
    return encoded, names, keep


def multi_hot(sets: list[list[int]], num_classes: int) -> "torch.Tensor":
    """(N, num_classes) float32: 1 where a text carries the label."""
    import torch

    out = torch.zeros(len(sets), num_classes)
    for row, indices in enumerate(sets):
        out[row, indices] = 1.0
    return out


def class_counts(labels: "torch.Tensor", num_classes: int) -> "torch.Tensor":
    """Training texts per class: class ids (N,) or multi-hot (N, C)."""
    import torch

    if labels.ndim == 2:
        return labels.sum(0)
    return torch.bincount(labels.long(), minlength=num_classes).float()


def is_imbalanced(counts: "torch.Tensor", multi_label: bool) -> bool:
    """Where accuracy says little: several labels a text, or a class IMBALANCE_RATIO times rarer than the
    commonest."""
    present = counts[counts > 0]
    return multi_label or (len(present) > 1 and float(present.max() / present.min()) >= IMBALANCE_RATIO)


def balanced_weights(counts: "torch.Tensor", total: int, multi_label: bool) -> "torch.Tensor":
    """scikit-learn's class_weight="balanced": total / (classes × count) per class, so each class weighs the same
    in the loss. Several labels a text: each label's positive weight negatives / positives (BCE's pos_weight), so
    its positives weigh as much as its negatives. A class without training texts gets weight 1."""
    import torch

    counts = counts.float()
    if multi_label:
        weights = (total - counts) / counts
    else:
        weights = total / (len(counts) * counts)
    return torch.where(counts > 0, weights, torch.ones_like(weights))


def monitored_metric(imbalanced: bool) -> str:
    """What validation selects checkpoints and stops on: macro-F1 where accuracy says little, else accuracy."""
    return "val/f1" if imbalanced else "val/acc"


def describe_counts(counts: "torch.Tensor", names: list[str]) -> str:
    order = counts.argsort(descending=True).tolist()
    most, least = order[0], order[-1]
    ratio = float(counts[most] / counts[least]) if counts[least] > 0 else math.inf
    return (f"commonest {names[most]!r} {int(counts[most])} texts, rarest {names[least]!r} {int(counts[least])} "
            f"(ratio {ratio:.1f})")
