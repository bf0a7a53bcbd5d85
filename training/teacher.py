"""The teacher step of a fit, before training: the n-gram teacher's out-of-fold probabilities for the training texts
(training/ngram_teacher.py), fitted once and cached as an entry of their own (data/cache.py), then attached to the
data module, whose training batches carry them as teacher_probs for model.distillation.

The entry's key is what the probabilities depend on: the texts and labels read (the data's reading settings and files,
data.cache.reading_key), the teacher and TEACHER_VERSION; not the tokenizer or the sizes, so a run that only
changes those (or states the sizes its first run chose, as `<run>/config.yaml` does) reuses the teacher's answers.
"""

import torch

from data.cache import data_name, entry_path, load_or_build, reading_key
from data.labels import class_counts, is_imbalanced
from training.ngram_teacher import EXACT_CHARS, FOLDS, SAMPLE, out_of_fold_probabilities

TEACHER_VERSION = 1  # part of the key: bump it when the teacher's answers for the same texts change


def attach_teacher(data) -> None:
    """The teacher of data.teacher ("ngram") for the data module `data` (its data built), fitted or read from the
    cache, attached to its training split (TextDataModule.attach_soft_targets). No teacher: nothing to do."""
    hp = data.hparams
    if hp.get("teacher") is None:
        return
    key = reading_key(hp) | {"teacher": hp.teacher, "teacher_version": TEACHER_VERSION,
                             "settings": [FOLDS, SAMPLE, EXACT_CHARS]}
    path = entry_path(hp.cache_dir, f"{data_name(hp)}-teacher", key)
    data.attach_soft_targets(load_or_build(path, lambda: fit_teacher(data), "teacher")["probabilities"])


def fit_teacher(data) -> dict:
    """{"probabilities": (N, C) float32}: the training split read again (the same texts, in the order encoded), whole
    texts (the teacher reads what n-grams it can, the student its tokens); classes imbalanced enough for balanced
    weights (data/labels.py is_imbalanced) make a balanced teacher, so its soft targets do not pull the student back to
    the commonest class."""
    splits = data.read_splits()
    labels, n = splits.labels["train"], len(splits.label_names)
    imbalanced = not splits.multi_label and is_imbalanced(class_counts(torch.as_tensor(labels), n), False)
    probabilities = out_of_fold_probabilities(splits.texts["train"], labels, n, seed=data.hparams.seed,
                                              source=splits.sources.get("train", "train"),
                                              class_weight="balanced" if imbalanced else None)
    return {"probabilities": probabilities}
