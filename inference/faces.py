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


def add_class_arguments(parser) -> None:
    """--attention-class and --allow-changed-class: a checkpoint of a user's own attention class loads only with the
    class named on the command (a checkpoint is data: it never imports code by itself, docs/BAD_INPUT.md)."""
    parser.add_argument("--attention-class", metavar="FILE.py:CLASS",
                        help="a checkpoint trained with your own attention class: name it, as in training "
                             "(path/to/file.py:ClassName or package.module:ClassName); its file's sha256 must equal "
                             "the one the checkpoint records. The product never imports a class a checkpoint names")
    parser.add_argument("--allow-changed-class", action="store_true",
                        help="with --attention-class: load it although its file's sha256 differs from the recorded one")


def check_class_arguments(parser, args) -> None:
    """--allow-changed-class goes with --attention-class (argparse's one-line error otherwise)."""
    if args.allow_changed_class and not args.attention_class:
        parser.error("--allow-changed-class goes with --attention-class")


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
