"""A user's attention class by name: found, imported, hashed and built (model/own_attention.py wraps it).

    "path/to/file.py:ClassName", "package.module:ClassName" or "package.module.ClassName"   (is_class_spec)
    load_attention_class(spec)      the class; each failure is one ConfigError line
    resolve_source(spec, recorded)  {"spec", "path", "sha256"}: what NetworkConfig.attention_source records
    build_user_layer(cls, ...)      cls built from the network's sizes, its constructor read by parameter names; a
                                    `config` object (nanoGPT's GPTConfig, a dict) made from the same sizes; names that
                                    can mean two sizes (d_out: the output width or one head's) resolved by probing
"""

import hashlib
import importlib
import importlib.util
import inspect
import os
import itertools
import sys
from pathlib import Path
from types import SimpleNamespace

from torch import nn

from model.errors import ConfigError

# Constructor parameter (or config attribute) names the network's settings fill, as published code spells them,
# each with the values tried in order: the first assignment under which the class builds and runs is kept
# (build_user_layer). d_out is the output width in the build-an-LLM book, one head's width in the course's class.
SIZE_NAMES = {
    "d_model": ("d_model", "embed_dim", "hidden_size", "dim", "d_in", "n_embd", "emb_dim", "model_dim",
                "embedding_dim", "d_hid"),
    "n_heads": ("n_heads", "num_heads", "num_attention_heads", "heads", "n_head", "h", "nhead", "head_count"),
    "d_head": ("d_k", "d_head", "head_dim", "dim_head", "head_size", "d_v", "attention_head_size"),
    "d_out": ("d_out", "out_dim", "dim_out", "d_output"),
    "length": ("context_length", "block_size", "max_len", "max_seq_len", "max_length", "max_position_embeddings",
               "n_ctx", "seq_len", "max_seq_length", "tokens_per_sample"),
    "dropout": ("dropout", "attn_dropout", "attn_pdrop", "resid_pdrop", "attention_probs_dropout_prob",
                "hidden_dropout_prob", "drop_rate", "dropout_rate", "attention_dropout", "dropout_p"),
}
CONFIG_NAMES = ("config", "cfg", "args", "model_args", "params", "hparams", "conf")  # one object holding the sizes
CONFIG_EXTRA = {"bias": True, "qkv_bias": False}  # what GPT-style configs also read, at their usual defaults
CONTEXT_LENGTH = 512  # the longest text a class with a fixed look-ahead buffer (block_size) is built for
ALLOW_CHANGED = "ATTENTION_ALLOW_CHANGED_CLASS"  # set to 1: load a checkpoint whose class file changed since
PLAIN = (str, int, float, bool, type(None))  # what attention_args may hold (the checkpoint stores it)
_loaded: dict[tuple[str, float], object] = {}  # file path, modification time → its module (a file runs once)


def is_class_spec(name: str) -> bool:
    """Whether an `attention` setting names a user's class rather than a registered kind (kinds have no . or :)."""
    return isinstance(name, str) and (":" in name or "." in name)


def split_spec(spec: str) -> tuple[str, str]:
    """(file or module, class name) of "file.py:Class", "package.module:Class" or "package.module.Class"."""
    where, sep, name = spec.rpartition(":")
    if not sep:
        where, _, name = spec.rpartition(".")
    if not where or not name or not name.isidentifier() or not sep and is_file(where):
        raise ConfigError(f"attention {spec!r}: expected path/to/file.py:ClassName, package.module:ClassName or "
                          "package.module.ClassName")
    return where, name


def is_file(where: str) -> bool:
    return where.endswith(".py") or "/" in where or "\\" in where


def load_attention_class(spec: str, path: str | Path | None = None) -> type[nn.Module]:
    """The nn.Module subclass a spec names (path, when given, replaces the spec's file: a checkpoint's recorded one).
    Every failure is one ConfigError line: the file missing, its import failing (with its first error line), no such
    class, not an nn.Module subclass."""
    where, name = split_spec(spec)
    if path is not None or is_file(where):
        module = _load_file(spec, Path(path if path is not None else where))
    else:
        try:
            module = importlib.import_module(where)
        except Exception as error:  # the user's module: any error it raises is reported, in one line
            raise ConfigError(f"attention {spec!r}: importing {where} failed: {first_line(error)}") from None
    found = getattr(module, name, None)
    if found is None:
        classes = sorted(n for n, v in vars(module).items() if inspect.isclass(v) and issubclass(v, nn.Module)
                         and v.__module__ == module.__name__)
        raise ConfigError(f"attention {spec!r}: no class {name} in {getattr(module, '__file__', where)} "
                          f"(its nn.Module classes: {', '.join(classes) or 'none'})")
    if not (inspect.isclass(found) and issubclass(found, nn.Module)):
        raise ConfigError(f"attention {spec!r}: {name} is not an nn.Module subclass "
                          "(expected class Name(nn.Module) with forward(x) or forward(x, mask))")
    return found


def _load_file(spec: str, path: Path) -> object:
    """The module a .py file defines, run once per version of the file (its modification time)."""
    if not path.is_file():
        raise ConfigError(f"attention {spec!r}: file {path} not found")
    path = path.resolve()
    key = (str(path), path.stat().st_mtime)
    if key in _loaded:
        return _loaded[key]
    # A name of its own per file, so that two users' files called attention.py do not replace each other.
    module_name = f"own_attention_{abs(hash(str(path))):x}_{path.stem}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling look a class's module up here
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:  # the user's file: any error it raises is reported, in one line
        del sys.modules[module_name]
        raise ConfigError(f"attention {spec!r}: importing {path} failed: {first_line(error)}") from None
    _loaded[key] = module
    return module


def class_file(cls: type) -> Path | None:
    """The .py file a class was defined in (None for a class without one)."""
    try:
        return Path(inspect.getfile(cls)).resolve()
    except (TypeError, OSError):
        return None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def resolve_source(spec: str, recorded: dict | None = None) -> dict:
    """{"spec", "path", "sha256"}: the class's file (absolute) and its hash, recorded in the network config.

    `recorded` (a checkpoint's, for the same spec) says which file the network was trained with: a relative path is
    looked for from the working directory first, then at the recorded absolute path; a file whose hash differs is
    refused (one ConfigError line) unless ATTENTION_ALLOW_CHANGED_CLASS=1. A module spec is hashed by its file."""
    if recorded is not None:
        fields = ("spec", "path", "sha256")
        if not (isinstance(recorded, dict) and all(isinstance(recorded.get(k), str) for k in fields)):
            raise ConfigError(f"attention_source must be {{'spec', 'path', 'sha256'}} strings (recorded by the "
                              f"product; leave it unset), got {recorded!r}")
        if recorded["spec"] != spec:
            recorded = None  # another class than the one recorded: recorded afresh
    where, _ = split_spec(spec)
    if is_file(where):
        tried = [Path(where)] + ([Path(recorded["path"])] if recorded is not None else [])
        path = next((p for p in tried if p.is_file()), None)
        if path is None:
            also = f" (recorded as {recorded['path']})" if recorded is not None and recorded["path"] != where else ""
            raise ConfigError(f"attention {spec!r}: file {where}{also} not found: this network needs its class file")
        path = path.resolve()
    else:
        path = class_file(load_attention_class(spec))
        if path is None:
            raise ConfigError(f"attention {spec!r}: its class has no source file to record")
    digest = file_sha256(path)
    if recorded is not None and recorded["sha256"] != digest and os.environ.get(ALLOW_CHANGED) != "1":
        raise ConfigError(f"attention {spec!r}: {path} changed since this network was trained (sha256 "
                          f"{recorded['sha256'][:12]}… recorded, {digest[:12]}… now); restore it, or set "
                          f"{ALLOW_CHANGED}=1 to load it anyway")
    return {"spec": spec, "path": str(path), "sha256": digest}


def check_attention_args(args) -> None:
    """attention_args: None or a dict of names to plain values (the checkpoint stores it as plain data)."""
    if args is None:
        return

    def plain(v, nested=True):
        return (isinstance(v, PLAIN) or isinstance(v, list) and all(isinstance(e, PLAIN) for e in v)
                or nested and isinstance(v, dict) and all(isinstance(k, str) and plain(e, False) for k, e in v.items()))

    if not isinstance(args, dict) or not all(isinstance(k, str) and plain(v) for k, v in args.items()):
        raise ConfigError(f"attention_args must be a dict of names to numbers, strings, booleans, lists of them or "
                          f"one config object of them ({{\"config\": {{\"n_embd\": 64}}}}), got {args!r}")


def configured_class(config) -> type[nn.Module]:
    """The class a NetworkConfig's attention names, from the file its attention_source records."""
    source = config.attention_source
    where, _ = split_spec(config.attention)
    return load_attention_class(config.attention, source["path"] if is_file(where) else None)


def size_candidates(d_model: int, n_heads: int, d_head: int) -> dict[str, list]:
    """Each name of SIZE_NAMES → the values it is tried with, in order."""
    tried = {"d_model": [d_model], "n_heads": [n_heads] + ([1] if n_heads != 1 else []),
             "d_head": [d_head] + ([d_model] if d_head != d_model else []),
             "d_out": [d_model] + ([d_head] if d_head != d_model else []), "length": [CONTEXT_LENGTH],
             "dropout": [0.0]}
    return {name: tried[size] for size, names in SIZE_NAMES.items() for name in names}


def config_object(given: dict | None, sizes: dict[str, list]):
    """A config object (attribute access) from a JSON object, the sizes it does not give filled from the network."""
    return SimpleNamespace(**(CONFIG_EXTRA | {name: values[0] for name, values in sizes.items()} | dict(given or {})))


def constructor_arguments(cls: type, d_model: int, n_heads: int, d_head: int, args: dict | None = None) -> dict:
    """The keyword arguments cls(**them) is built with, the first of constructor_choices."""
    return next(iter(constructor_choices(cls, d_model, n_heads, d_head, args)))


def constructor_choices(cls: type, d_model: int, n_heads: int, d_head: int, args: dict | None = None):
    """The keyword arguments cls(**them) may be built with, the likeliest first: each parameter named like a size
    (SIZE_NAMES) gets the network's (names that can mean two sizes, each in turn), a parameter named like a config
    (CONFIG_NAMES) an object holding them, `args` (attention_args) gives or overrides any; a required one nobody
    fills is a ConfigError line."""
    args = dict(args or {})
    sizes = size_candidates(d_model, n_heads, d_head)
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]  # after self
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    named = {p.name: p for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(args) - set(named)) if not takes_any else []
    if unknown:
        raise ConfigError(f"attention_args {unknown[0]!r}: {cls.__name__}.__init__ takes no such argument "
                          f"(it takes {', '.join(named) or 'none'})")
    options = {}
    for name, parameter in named.items():
        required = parameter.default is parameter.empty
        if name in args and not (name in CONFIG_NAMES and isinstance(args[name], dict)):
            options[name] = [args[name]]
        elif name in sizes and (required or name not in SIZE_NAMES["dropout"] + SIZE_NAMES["length"]):
            options[name] = sizes[name]
        elif name in CONFIG_NAMES and (required or name in args):
            options[name] = [config_object(args.get(name), sizes)]
        elif required:
            raise ConfigError(f"attention: {cls.__name__}.__init__ needs {name!r}, which no network setting fills: "
                              f"give it with --model.network.attention_args '{{\"{name}\": ...}}'")
    names = list(options)
    return [dict(zip(names, values)) for values in itertools.islice(itertools.product(*options.values()), 16)]


def build_user_layer(cls: type, d_model: int, n_heads: int, d_head: int, args: dict | None = None,
                     runs=None) -> nn.Module:
    """cls built from the network's sizes and attention_args: the first of constructor_choices under which it
    builds and `runs(module, d_model)` says it runs (model/mask_probe.py's `runs`, given by the adapter), else the
    first that builds; a constructor that raises under every choice is one ConfigError line (the first choice's)."""
    choices = constructor_choices(cls, d_model, n_heads, d_head, args)
    first_built, first_error = None, None
    for arguments in choices:
        try:
            user = cls(**arguments)
        except Exception as error:  # the user's constructor
            first_error = first_error or (arguments, error)
            continue
        if len(choices) == 1 or runs is None or runs(user, d_model):
            return user
        first_built = first_built or user
    if first_built is not None:
        return first_built
    arguments, error = first_error
    shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    raise ConfigError(f"attention: {cls.__name__}({shown}) failed: {first_line(error)}")


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
