"""The splits a run trains, validates and tests on: a stratified share held out (the same for the same seed), and
the checks that every split can be scored.
"""

import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from data.errors import DataError

if TYPE_CHECKING:
    from data.columns import TextColumn


# The fixed test split of a dataset with test_fraction: its own seed, independent of data.seed and val_fraction, so
# every run scores the same held-out texts. 14, not data.seed's default 0: the
# shipped configs were tuned on the validation rows seed 0 draws, so the test rows are drawn apart from them.
TEST_SPLIT_SEED = 14


@dataclass
class Splits:
    texts: dict[str, "TextColumn"]  # or lists: any sequence of texts
    labels: dict[str, list[int]]
    label_names: list[str]
    sources: dict[str, str] = field(default_factory=dict)  # split → the file (or hub split) it came from
    multi_label: bool = False  # labels[split] then holds a list of class indices per text (data/labels.py)


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
