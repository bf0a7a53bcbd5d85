"""How train.py's parser reports a config mistake: one line naming where the key was given (a config file or the
command line) and the key, with the nearest accepted name ("did you mean"), instead of jsonargparse's ~110-line
usage message; and long flags taken only whole: without prefix matching `--model.network.n_head 4` is an unknown
flag, not silently `n_heads`.

    error: bad.yaml: trainer.max_epoch is not an option of `train.py fit` (did you mean trainer.max_epochs?); ...
"""

import difflib
import inspect
import pydoc
import re
import sys
from pathlib import Path

import yaml
from jsonargparse._common import debug_mode_active  # jsonargparse's JSONARGPARSE_DEBUG: its own long message
from lightning.pytorch.cli import LightningArgumentParser

from model.config import ConfigError

MAX_MESSAGE = 300  # characters of jsonargparse's own reason kept in the line


class ArgumentParser(LightningArgumentParser):
    """LightningArgumentParser without prefix matching, whose errors are one line (see the module docstring).
    `given` holds the arguments being parsed, to find the file that holds a key."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.given: list[str] = []

    def parse_args(self, args=None, *rest, **kwargs):
        if args is None or isinstance(args, (list, tuple)):
            self.given = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, *rest, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or debug_mode_active():
            super().error(message, ex)
        subcommand = getattr(ex, "subcommand_parser", None)
        parser = subcommand or self.subcommand_parser(self.given) or self
        sys.stderr.write(f"error: {explain(message, parser, self.given)}\n")
        sys.exit(2)

    def subcommand_parser(self, given: list[str]):
        """The parser of the subcommand in `given` (fit, validate, ...): it knows the options, the main one does not."""
        action = getattr(self, "_subcommands_action", None)
        parsers = getattr(action, "_name_parser_map", {}) if action is not None else {}
        return next((parsers[arg] for arg in given if arg in parsers), None)


def explain(message: str, parser, given: list[str]) -> str:
    """jsonargparse's error `message` as one line: where, which key, why, and the nearest accepted key. `parser`:
    the (sub)command's parser, which knows its options."""
    command = f"`{parser.prog.replace(' [options]', '')}`"  # train.py fit
    if match := re.match(r"unrecognized arguments: (\S+)", message):
        flag = match.group(1)
        key = flag.lstrip("-").split("=")[0]
        return (f"the command line: {flag.split('=')[0]} is not an option of {command}"
                f"{suggestion(key, option_keys(parser), '--')}; `{command[1:-1]} --help` lists them")
    match = (re.search(r"does not accept option '([^']+)'", message) or re.search(r"Option '([^']+)' is not accepted",
                                                                                   message))
    if match:
        key = match.group(1)
        where, path, class_path = locate(key, given, parser)
        shown = path or key
        if class_path:  # a class's init_args (a callback's): its own argument names
            return (f"{where}{shown} is not an argument of {class_path}{suggestion(key, init_arguments(class_path))}")
        return (f"{where}{shown} is not an option of {command}{suggestion(shown, option_keys(parser))}; "
                f"`{command[1:-1]} --help` lists them")
    if match := re.match(r'Parser key "([^"]+)":\s*(.*)', message, re.S):
        key, reason = match.groups()
        where, path, _ = locate(key, given, parser)
        return f"{where}{path or key}: {one_line(reason)}"
    return one_line(message)


def one_line(text: str) -> str:
    text = re.sub(r"<class '(?:builtins\.)?([\w.]+)'>", r"\1", " ".join(text.split()))
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"


def suggestion(key: str, candidates, prefix: str = "") -> str:
    close = difflib.get_close_matches(key, list(candidates), n=1, cutoff=0.75)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def option_keys(parser) -> list[str]:
    """Every long option the parser accepts, without its dashes (model.lr, trainer.max_epochs, ...)."""
    return sorted({option[2:] for option in getattr(parser, "_option_string_actions", {}) if option.startswith("--")})


def init_arguments(class_path: str) -> list[str]:
    """The keyword arguments of the class a config names (a callback's init_args); none if it does not import."""
    cls = pydoc.locate(class_path)
    try:
        return [name for name in inspect.signature(cls).parameters if name not in ("self", "args", "kwargs")]
    except (TypeError, ValueError):
        return []


def locate(key: str, given: list[str], parser) -> tuple[str, str | None, str | None]:
    """Where `key` was given: ("<file>: ", dotted path in it, class_path of the class whose init_args hold it) for
    the last config file holding it, else the command line when a flag names it, else nothing known."""
    if any(arg.split("=")[0] == f"--{key}" for arg in given):
        return "the command line: ", f"--{key}", None
    for path in reversed(config_files(given, parser)):
        try:
            config = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            continue
        found = find_key(config, key)
        if found is not None:
            return f"{path}: ", *found
    return "", None, None


def config_files(given: list[str], parser) -> list[str]:
    files = [str(f) for f in getattr(parser, "default_config_files", None) or []]
    for at, arg in enumerate(given):
        if arg in ("--config", "-c") and at + 1 < len(given):
            files.append(given[at + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def find_key(config, key: str, path: str = "", class_path: str | None = None):
    """(dotted path, class_path around it) of `key` in a loaded YAML: a dotted key from the top (trainer.max_epoch),
    or a leaf name (evry) anywhere, such as inside a callback's init_args; None if absent."""
    if isinstance(config, dict):
        if path == "" and "." in key:
            node = config
            for part in key.split("."):
                if not isinstance(node, dict) or part not in node:
                    break
                node = node[part]
            else:
                return key, None
        class_path = config.get("class_path", class_path) if isinstance(config.get("class_path"), str) else class_path
        for name, value in config.items():
            where = f"{path}.{name}" if path else str(name)
            if name == key:
                return where, class_path
            if (found := find_key(value, key, where, class_path)) is not None:
                return found
    elif isinstance(config, list):
        for index, value in enumerate(config):
            if (found := find_key(value, key, f"{path}[{index}]", class_path)) is not None:
                return found
    return None


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

