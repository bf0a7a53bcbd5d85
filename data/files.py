"""Writing a file so that nothing already saved is lost: every writer of the project goes through here.

    write_atomically("pruned.ckpt", lambda path: torch.save(checkpoint, path), what="checkpoint", inputs=[source])
    make_folder("exported/", what="export folder")  # a folder to write into, or one line saying why not

The target is checked first (check_target: not a directory, not one of the files being read, in a folder that
exists and can be written), so a command can refuse it in one line before any computation. Then the content is
written to a temporary file in the target's folder and moved over the target with os.replace: the target is either
left as it was or replaced whole, never half-written (a full disk, a killed process). Any failure is a WriteError:
one line naming the target and the reason (OSError, and the RuntimeError torch.save raises for the same faults).

Lives in data/ because every package (data's cache, training, inference, monitor, bench) may import data.* without
pulling Lightning in; it imports nothing of ours.
"""

import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path


class WriteError(ValueError):
    """The target cannot be written; the message is one line naming it and why."""


def check_target(target, what: str = "file", inputs: Iterable = ()) -> Path:
    """`target` as a Path, or WriteError unless it could be written without touching anything being read."""
    target = Path(target)
    if target.is_dir():
        raise WriteError(f"{target}: is a directory; give a file name for the {what}")
    for source in inputs:
        if source is not None and target.exists() and Path(source).exists() and os.path.samefile(target, source):
            raise WriteError(f"{target}: is the {what}'s own input ({source}); write to another file, so the "
                             "input stays as it is")
    folder = target.parent
    if not folder.is_dir():
        blocking = next((path for path in (folder, *folder.parents) if path.exists() and not path.is_dir()), None)
        if blocking is not None:
            raise WriteError(f"{target}: cannot write the {what}: {blocking} is a file, not a folder")
        raise WriteError(f"{target}: folder {folder} does not exist (create it first)")
    if not os.access(folder, os.W_OK | os.X_OK):  # also False on a read-only filesystem, even for root
        raise WriteError(f"{target}: cannot write the {what}: folder {folder} is not writable")
    if target.exists() and not os.access(target, os.W_OK):
        raise WriteError(f"{target}: cannot write the {what}: the file is read-only")
    return target


def make_folder(folder, what: str = "folder") -> Path:
    """`folder` created with its parents if missing, or WriteError (one line naming it and why: a read-only
    filesystem, no permission, a path through a file). An existing folder is left as it is."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise WriteError(f"{folder}: exists and is not a folder")
    blocking = next((parent for parent in folder.parents if parent.exists() and not parent.is_dir()), None)
    if blocking is not None:
        raise WriteError(f"{folder}: cannot create the {what}: {blocking} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise WriteError(f"{folder}: cannot create the {what}: {reason(e)}") from e
    return folder


def write_atomically(target, write: Callable[[Path], object], what: str = "file", inputs: Iterable = ()) -> Path:
    """Call `write(temporary_path)`, then move the result over `target` (see the module docstring). Returns the
    target; WriteError (one line) if it is refused or the write fails, the target then left as it was."""
    target = check_target(target, what, inputs)
    try:
        handle, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
        os.close(handle)
    except OSError as e:
        raise WriteError(f"{target}: cannot write the {what}: {reason(e)}") from e
    temporary = Path(name)
    try:
        write(temporary)
        os.chmod(temporary, _mode(target))  # mkstemp makes 0600; keep the target's mode, or the usual one
        os.replace(temporary, target)
    except (OSError, RuntimeError) as e:  # torch.save reports a failed write (a full disk) as RuntimeError
        temporary.unlink(missing_ok=True)
        raise WriteError(f"{target}: cannot write the {what}: {reason(e)}") from e
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return target


def write_text(target, text: str, what: str = "file", inputs: Iterable = ()) -> Path:
    return write_atomically(target, lambda path: path.write_text(text, encoding="utf-8"), what, inputs)


def reason(error: BaseException) -> str:
    """The first line of what went wrong: an OSError's strerror, else the message, else the exception's type."""
    text = getattr(error, "strerror", None) or str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def describe(error: BaseException) -> str:
    """The exception's type and first line, e.g. "EOFError" or "KeyError: 'splits'", for a warning."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _mode(target: Path) -> int:
    if target.exists():
        return target.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
