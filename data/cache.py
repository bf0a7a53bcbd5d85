"""One cache entry: a file under cache_dir named by a hash of everything its content depends on, built once and read
memory-mapped after. The encoded data (data/datamodule.py) and the n-gram teacher's answers (training/teacher.py) are
two entries, each with its own key, so a change to one never rebuilds the other.

    path = entry_path(cache_dir, "sst2", {"dataset": "sst2", "files": file_stamps(files), "version": 8})
    content = load_or_build(path, build, "encoded data")  # a dict of tensors (and plain values)

A file is identified in a key by its path, size and modification time (file_stamps): an edited file is read again.
One lock file per entry (`<name>.lock` beside it, left in place: removing it would race with a process about to
lock it): with several processes (DDP) the first builds, the others wait and load; other entries do not wait. A
cache folder that cannot be written is not an error: the content is built in memory, with a warning.
"""

import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch
from filelock import FileLock

from data.files import WriteError, describe, write_atomically
from data.sources import DataError

log = logging.getLogger(__name__)


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
