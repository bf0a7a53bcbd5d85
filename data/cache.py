"""Cache entries: a file under cache_dir named by a hash of everything its content depends on, built once and read
memory-mapped after. The encoded data (data/datamodule.py) and the n-gram teacher's answers (training/teacher.py) are
two entries, each with its own key, so a change to one never rebuilds the other.

    path = entry_path(cache_dir, "sst2", {"dataset": "sst2", "files": file_stamps(files), "version": 8})
    content = load_or_build(path, build, "encoded data")  # a dict of tensors (and plain values)

A file is identified in a key by its path, size and modification time (file_stamps): an edited file is read again.
One lock file per entry (`<name>.lock` beside it, left in place: removing it would race with a process about to
lock it): with several processes (DDP) the first builds, the others wait and load; other entries do not wait. A
cache folder that cannot be written is not an error: the content is built in memory, with a warning.
"""

import ctypes
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock

from data.files import WriteError, describe, write_atomically
from data.reading import LABEL_NAMES_FILE
from data.sources import DataError, local_copy_dir

log = logging.getLogger(__name__)
CACHE_VERSION = 8  # part of every key: bump it when tokenization or the splits read change
# What the splits read depend on (with the files themselves): part of the key of every entry made from them.
READING = ("dataset", "data_dir", "train_file", "val_file", "test_file", "text_column", "label_column",
           "label_separator", "label_names_file", "val_fraction", "seed")
NOT_ENCODED = ("batch_size", "num_workers", "cache_dir", "bucket_pool", "balanced_sampler", "teacher")


def reading_key(settings) -> dict:
    """What the splits read with these data settings depend on: the reading settings and the files. The key of the
    encoded data (with the tokenizer's settings) and of the teacher's answers (training/teacher.py)."""
    return {name: settings.get(name) for name in READING} | {
        "files": file_stamps(data_files(settings) + extra_files(settings)), "version": CACHE_VERSION}


def encoded_path(settings, **chosen) -> Path:
    """The encoded data's entry for these data settings (TextDataModule's); `chosen`: sizes to key it by in place
    of unset ones."""
    key = {k: v for k, v in (dict(settings) | chosen).items() if k not in NOT_ENCODED}
    if key.get("max_length") is not None:
        key.pop("max_length_caps", None)  # they only decide an unset max_length
    return entry_path(settings["cache_dir"], data_name(settings), key | reading_key(settings))


def data_name(settings) -> str:
    """The name entries of these data start with: the training file's, or the dataset's."""
    return Path(settings["train_file"]).stem if settings["train_file"] else settings["dataset"]


def data_files(settings) -> list[str]:
    """The files the data are read from: train/val/test files, or every file of the local copy."""
    files = [settings[k] for k in ("train_file", "val_file", "test_file") if settings[k]]
    own = files or settings["dataset"] == "synthetic"
    folder = None if own else local_copy_dir(settings["dataset"], settings["data_dir"])
    return sorted(str(p) for p in folder.iterdir() if p.is_file()) if folder is not None else files


def extra_files(settings) -> list[str]:
    """Files besides the data's own whose change must read the data again: a label names file, the pretraining
    checkpoint whose tokenizer is used, a pretraining run's unlabeled files."""
    names = settings.get("label_names_file") or (settings["train_file"] and Path(settings["train_file"]).parent
                                                 / LABEL_NAMES_FILE)
    named = [str(names)] if names and (settings.get("label_names_file") or Path(names).is_file()) else []
    return ([settings["tokenizer_from"]] if settings.get("tokenizer_from") else []) + named + \
        list(settings.get("unlabeled_files") or [])


def file_stamps(files) -> list[tuple[str, int, int]]:
    """(resolved path, size, modification time) of each file; DataError naming a missing one."""
    stamps = []
    for f in files:
        try:
            st = os.stat(f)
        except OSError:
            raise DataError(f"{f}: file not found") from None
        stamps.append((str(Path(f).resolve()), st.st_size, int(st.st_mtime)))
    return stamps


def entry_path(cache_dir, name: str, key: dict) -> Path:
    """cache_dir/<name>-<16 hex digits of the key's sha256>.pt."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(cache_dir) / f"{name}-{digest}.pt"


def load_encoded(settings, build: Callable[[], dict]) -> tuple[dict, list[list]]:
    """The encoded data of these data settings (TextDataModule's) from their entry, or build() saved as it; and
    [path, size, modification time] of each data file as read (the checkpoint records them). Sizes chosen because they
    were unset also key the entry (a hard link), so `train.py test --config <run>/config.yaml`, which states them,
    finds it."""
    stamps = [list(stamp) for stamp in file_stamps(data_files(settings))]
    path = encoded_path(settings)
    content = load_or_build(path, build, "encoded data")
    if settings.get("max_length") is None or settings.get("vocab_size") is None:
        link(path, encoded_path(settings, max_length=content["max_length"], vocab_size=content["vocab_size"]))
    return_freed_memory()
    return content, stamps


def load_or_build(path: Path, build: Callable[[], dict], what: str) -> dict:
    """The entry at `path`, or build() saved there and read back memory-mapped (the built copy is then freed)."""
    lock = FileLock(path.with_suffix(".lock"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except OSError as e:
        log.warning("cache_dir %s cannot be written (%s): %s built without a cache", path.parent, e.strerror, what)
        return load(path, what) or build()
    try:
        content = load(path, what)
        if content is None:
            content = build()
            if save(content, path, what):
                content = load(path, what) or content
        return content
    finally:
        lock.release()


def load(path: Path, what: str) -> dict | None:
    """The entry, memory-mapped: tensors are read from the file as they are used, and processes on one machine (DDP
    ranks, DataLoader workers) share one copy in the page cache. None when missing or unreadable (built again)."""
    if not path.exists():
        return None
    try:
        content = torch.load(path, weights_only=True, mmap=True)
    except Exception as e:
        log.warning("%s: unreadable cache (%s); %s built again", path, describe(e), what)
        return None
    log.info("loaded %s from %s", what, path)
    return content


def save(content: dict, path: Path, what: str) -> bool:
    """Whether the entry was written (a full disk or a read-only folder: a warning, the content stays in memory)."""
    try:
        write_atomically(path, lambda temporary: torch.save(content, temporary), "cache")
        return True
    except WriteError as e:
        log.warning("%s; the %s stay in memory only", e, what)
        return False


def link(path: Path, alias: Path) -> None:
    """The entry at `path` also under `alias` (another key for the same content), as a hard link: no second copy."""
    try:
        if path.exists() and not alias.exists():
            os.link(path, alias)
    except OSError as e:  # a filesystem without hard links: the alias is built again when asked for
        log.debug("cache %s not linked as %s: %s", path, alias, e)


def return_freed_memory() -> None:
    """Hand the memory that reading and tokenizing freed back to the system: glibc keeps freed small blocks in its
    heap, and the run would carry them to its end (IMDB, built: 1.0 GB resident, 0.54 GB after)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): they return memory their own way
        pass
