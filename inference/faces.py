"""How a command-line face (predict.py, export.py) reports: its notes on stderr through its own logger, and bad
input (a ValueError: CheckpointError, InputError, WriteError, a bad --device) as one line `error: ...` with exit
status 2, the traceback only with --debug.

Imports nothing heavy, so `--help` and argument errors answer without loading torch.
"""

import logging
import os
import sys


def notes_to_stderr(log: logging.Logger, prefix: str = "") -> None:
    """`log`'s INFO and above on stderr as `prefix` + the message alone, apart from the root logger's handlers."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{prefix}%(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False


def run_face(run, args) -> int:
    """`run(args)`'s exit status; a ValueError it raises is one line on stderr and status 2 (re-raised with
    args.debug), a reader that closed stdout (`| head`) stops it quietly with status 1."""
    try:
        return run(args)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error when Python flushes stdout
        return 1
    except ValueError as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
