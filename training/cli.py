"""How train.py's parser reports a config mistake: one line instead of jsonargparse's ~110-line usage message, and
long flags taken only whole (without prefix matching `--model.network.n_head 4` is an unknown flag, not silently
`n_heads`).

A key no option takes, found by looking up what was given (the flags, the config files, a callback's init_args)
among the keys the (sub)command's parser holds (its public `get_defaults()`) and a class's signature, is named with
where it was given and the nearest accepted key:

    error: bad.yaml: trainer.max_epoch is not an option of `train.py fit` (did you mean trainer.max_epochs?)

Any other mistake is jsonargparse's own message, on one line, after the config file or the command line that gave
the key it names. Nothing here reads jsonargparse's message apart: a new wording reaches the user as it is.
"""

import difflib
import inspect
import os
import pydoc
import sys
from pathlib import Path

import yaml
from lightning.pytorch.cli import LightningArgumentParser

from model.config import ConfigError

MAX_MESSAGE = 300  # characters of jsonargparse's own message kept in the line


class ArgumentParser(LightningArgumentParser):
    """LightningArgumentParser without prefix matching, whose errors are one line (see the module docstring).
    `given` holds the arguments being parsed; `family` the parsers of one command line (the main one and one per
    subcommand, training/commands.py CLI.init_parser), so the main parser can name the options of the subcommand."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.given: list[str] = []
        self.family: list = [self]

    def parse_args(self, args=None, *rest, **kwargs):
        if args is None or isinstance(args, (list, tuple)):
            self.given = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, *rest, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):  # jsonargparse's own long message
            super().error(message, ex)
        sys.stderr.write(f"error: {explain(message, self.subcommand_parser(self.given), self.given)}\n")
        sys.exit(2)

    def subcommand_parser(self, given: list[str]):
        """The parser of the subcommand in `given` (fit, validate, ...): it knows the options, the main one does not."""
        named = {parser.prog.split()[-1]: parser for parser in self.family if parser is not self}
        return next((named[arg] for arg in given if arg in named), self)


def explain(message: str, parser, given: list[str]) -> str:
    """One line for jsonargparse's error `message`: an unknown key found in what was given, or the message itself
    after where the key it names was given. `parser`: the (sub)command's parser, which knows its options."""
    command = parser.prog.replace(" [options]", "")  # train.py fit
    try:
        accepted = set(parser.get_defaults().keys())
    except Exception:  # noqa: BLE001 (a default config file it cannot read: its own message says so)
        accepted = set()
    branches = {key.rsplit(".", depth)[0] for key in accepted for depth in range(1, key.count(".") + 1)}
    if accepted:
        if unknown := unknown_flag(given, accepted, branches):
            return (f"the command line: --{unknown} is not an option of `{command}`"
                    f"{suggestion(unknown, accepted, '--')}; `{command} --help` lists them")
        for path in config_files(given, parser):
            found = unknown_in(read_yaml(path), accepted, branches)
            if found is not None:
                key, class_path, candidates = found
                owner = f"an argument of {class_path}" if class_path else f"an option of `{command}`"
                name = key.rsplit(".", 1)[-1] if class_path else key
                return f"{path}: {key} is not {owner}{suggestion(name, candidates)}"
    return f"{where(message, given, parser)}{one_line(message)}"


def unknown_flag(given: list[str], accepted: set[str], branches: set[str]) -> str | None:
    """The first `--a.b` flag that is no option and lies under none (a class's or a dict's own keys pass through)."""
    for arg in given:
        if arg.startswith("--") and "." in arg:
            key = arg[2:].split("=")[0].rstrip("+")  # --trainer.callbacks+=...: appends to a list option
            parts = key.split(".")
            if key not in branches and not any(".".join(parts[:n]) in accepted for n in range(1, len(parts) + 1)):
                return key
    return None


def unknown_in(config, accepted: set[str], branches: set[str], path: str = ""):
    """(dotted key, class path or None, the keys it could have meant) of the first key of a loaded config file that
    no option takes, looking into the init_args of the classes it names; None when every key is taken."""
    if isinstance(config, dict):
        class_path = config.get("class_path")
        if isinstance(class_path, str) and isinstance(config.get("init_args"), dict):
            arguments = init_arguments(class_path)
            for name in config["init_args"]:
                if arguments and name not in arguments:
                    return f"{path}.init_args.{name}" if path else f"init_args.{name}", class_path, arguments
            return None
        for name, value in config.items():
            key = f"{path}.{name}" if path else str(name)
            if key in accepted:
                found = unknown_in(value, set(), set(), key) if isinstance(value, (list, dict)) else None
            elif key in branches:
                found = unknown_in(value, accepted, branches, key)
            elif not path or path in branches:  # under an option's own value (a dict, a class) anything goes
                return key, None, accepted
            else:
                found = None
            if found is not None:
                return found
    elif isinstance(config, list):
        for index, value in enumerate(config):
            if (found := unknown_in(value, set(), set(), f"{path}[{index}]")) is not None:
                return found
    return None


def where(message: str, given: list[str], parser) -> str:
    """"<file>: " or "the command line: " that gave the longest key `message` names (in quotes, as jsonargparse
    names keys); "" when none is found."""
    places = []
    for arg in given:
        if arg.startswith("--"):
            places.append((arg[2:].split("=")[0], "the command line"))
    for path in config_files(given, parser):
        places.extend((key, path) for key in dotted_keys(read_yaml(path)))
    named = [(len(key), place) for key, place in places if f'"{key}"' in message or f"'{key}'" in message]
    return f"{max(named)[1]}: " if named else ""


def dotted_keys(config, path: str = ""):
    if isinstance(config, dict):
        for name, value in config.items():
            key = f"{path}.{name}" if path else str(name)
            yield key
            yield from dotted_keys(value, key)


def read_yaml(path: str):
    try:
        return yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None


def one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def suggestion(key: str, candidates, prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.75)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def init_arguments(class_path: str) -> list[str]:
    """The keyword arguments of the class a config names (a callback's init_args); none if it does not import."""
    cls = pydoc.locate(class_path)
    try:
        return [name for name in inspect.signature(cls).parameters if name not in ("self", "args", "kwargs")]
    except (TypeError, ValueError):
        return []


def config_files(given: list[str], parser) -> list[str]:
    files = [str(f) for f in parser.default_config_files or []]
    for at, arg in enumerate(given):
        if arg in ("--config", "-c") and at + 1 < len(given):
            files.append(given[at + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def wrapped_config_error(error: BaseException) -> ConfigError | None:
    """The ConfigError behind an error jsonargparse raised while building a class (its "Does not validate against
    any of the Union subtypes" lists it among other lines), or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, ConfigError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None
