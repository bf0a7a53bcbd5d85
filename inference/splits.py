"""The labelled texts of a checkpoint's own dataset split, made from the data settings the checkpoint saved (as
train.py makes them; ATTENTION_DATA_ROOT for the local copy): what head pruning and the faithfulness bench score on."""

from data.sources import load_splits
from data.checkpoint import read_checkpoint

# The data settings a checkpoint records that decide its splits (load_splits' arguments): diagnose.py reads them too.
SPLIT_KEYS = ("dataset", "data_dir", "train_file", "val_file", "test_file", "text_column", "label_column",
              "val_fraction", "seed", "label_separator")


def checkpoint_split(path, split: str, checkpoint: dict | None = None) -> tuple[list[str], list[int], list[str]]:
    """Texts, labels and label names of `split`; ValueError (one line, naming the file or split) when the checkpoint
    saved no data settings or the data have no such split (DataError, a ValueError, on unreadable data).
    `checkpoint`: the file's dict when the caller has read it already."""
    checkpoint = read_checkpoint(path) if checkpoint is None else checkpoint
    settings = checkpoint.get("datamodule_hyper_parameters") or {}
    if "dataset" not in settings:
        raise ValueError(f"{path}: no data settings saved in the checkpoint, so its {split} split is unknown")
    splits = load_splits(**{key: settings.get(key) for key in SPLIT_KEYS})
    if split not in splits.texts:
        raise ValueError(f"split {split!r} not found; the data has {', '.join(splits.texts)}")
    return list(splits.texts[split]), splits.labels[split], splits.label_names
