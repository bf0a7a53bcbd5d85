"""A user's attention class by name: found, imported, hashed and built (layer.py wraps it).

    "path/to/file.py:ClassName", "package.module:ClassName" or "package.module.ClassName"   (is_class_spec)
    name_class(spec, recorded)      the class the user named on a command, hashed (checked against a checkpoint's
                                    record), imported and trusted: {"spec", "path", "sha256"}, what
                                    NetworkConfig.attention_source records
    named_network(network, spec)    a checkpoint's network dict with the class the user named recorded in it
    configured_class(config)        the class a config records, if the user named it in this process
    load_attention_class(spec)      the class a spec names; each failure is one ConfigError line

A checkpoint is data (docs/BAD_INPUT.md): its spec, path and hash are written by whoever made it, so nothing here
imports what a checkpoint names. The user names the class on the command that loads the checkpoint; the class is
found by their spec, its file's hash compared with the recorded one before the file runs.

How a class is built from the network's sizes: constructor.py.
"""

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from pathlib import Path, PurePath

import torch
from torch import nn

from model.errors import ConfigError

ALLOW_CHANGED = "ATTENTION_ALLOW_CHANGED_CLASS"  # set to 1: load a checkpoint whose class file changed since
ARGS_FLAG = "--model.network.attention_args"  # train.py's option for attention_args (diagnose.py's: --args)
PLAIN = (str, int, float, bool, type(None))  # what attention_args may hold (the checkpoint stores it)
_loaded: dict[tuple[str, float], object] = {}  # file path, modification time → its module (a file runs once)
_named: dict[tuple[str, str], type] = {}  # (file sha256, class name) → a class the user named in this process


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


def load_attention_class(spec: str) -> type[nn.Module]:
    """The nn.Module subclass a spec names, imported: only ever a spec the user gave on this command (name_class,
    diagnose.py --attention). Every failure is one ConfigError line: the file missing, its import failing (with its
    first error line), no such class, not an nn.Module subclass."""
    where, _ = split_spec(spec)
    if is_file(where):
        path = Path(where)
        if not path.is_file():
            raise ConfigError(f"attention {spec!r}: file {path} not found")
        return class_in(_load_file(spec, path), spec)
    try:
        module = guarded(lambda: importlib.import_module(where))
    except Exception as error:  # the user's module: any error it raises is reported, in one line
        raise ConfigError(f"attention {spec!r}: importing {where} failed: {first_line(error)}") from None
    return class_in(module, spec)


def class_in(module, spec: str) -> type[nn.Module]:
    """The class a spec names in its module, checked to be an nn.Module subclass (one ConfigError line if not)."""
    where, name = split_spec(spec)
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


class UserExit(Exception):
    """A user's file or class called sys.exit() (SystemExit) while the product ran it."""


def guarded(run):
    """run(), a SystemExit it raises turned into UserExit, so that it is reported as one line like any other error
    of the user's code (KeyboardInterrupt passes: Ctrl-C still stops the command)."""
    try:
        return run()
    except SystemExit as stop:
        raise UserExit(f"it called sys.exit({stop.code!r})") from None


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
        guarded(lambda: module_spec.loader.exec_module(module))
    except Exception as error:  # the user's file: any error it raises is reported, in one line
        del sys.modules[module_name]
        raise ConfigError(f"attention {spec!r}: importing {path} failed: {first_line(error)}") from None
    _loaded[key] = module
    return module


def display_name(cls: type) -> str:
    """How the product names a user's class in its lines: path/to/file.py:Class for a class of a file (its module's
    name is the product's own, own_attention_<hash>_<stem>), package.module.Class otherwise."""
    path = class_file(cls)
    if inspect.isclass(cls) and cls.__module__.startswith("own_attention_") and path is not None:
        return f"{path}:{cls.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def class_file(cls: type) -> Path | None:
    """The .py file a class was defined in (None for a class without one)."""
    try:
        return Path(inspect.getfile(cls)).resolve()
    except (TypeError, OSError):
        return None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def name_class(spec: str, recorded: dict | None = None, *, flag: str = "attention", allow_changed: bool = False,
               override: str = f"set {ALLOW_CHANGED}=1") -> dict:
    """The user names a class (train.py's --model.network.attention, a face's --attention-class, diagnose.py's
    --attention, the API's `attention=`): the one door through which a class file is imported. Returns {"spec",
    "path", "sha256"}, the record a NetworkConfig keeps, and trusts the class for this process by its file's hash
    and its name (configured_class finds it there; nothing else is ever imported for a network).

    `recorded` (a checkpoint's attention_source, for a network trained with it): the class must have the recorded
    name and its file the recorded hash, a file checked before it runs; a mismatch is one ConfigError line naming
    `override` (how to allow it), unless `allow_changed` or ATTENTION_ALLOW_CHANGED_CLASS=1. `flag` is the option
    the user gave the spec with, named in each error line."""
    where, name = split_spec(spec)
    if recorded is not None:
        trained = split_spec(recorded["spec"])[1]
        if name != trained:
            raise ConfigError(f"{flag} {spec!r}: this network was trained with a class named {trained}, not {name}")
    allowed = allow_changed or os.environ.get(ALLOW_CHANGED) == "1"

    def check(path: Path) -> str:
        digest = file_sha256(path)
        if recorded is not None and digest != recorded["sha256"] and not allowed:
            raise ConfigError(f"{flag} {spec!r}: {path} is not the file this network was trained with (sha256 "
                              f"{recorded['sha256'][:12]}… recorded, {digest[:12]}… now): name that file, or "
                              f"{override} to load it anyway")
        return digest

    if is_file(where):
        path = Path(where)  # relative to the working directory: the user typed it on this command
        if not path.is_file():
            raise ConfigError(f"{flag} {spec!r}: file {where} not found: this network needs its class file")
        path = path.resolve()
        digest = check(path)  # before the file runs: a file that is not the recorded one never does
        cls = class_in(_load_file(spec, path), spec)
    else:  # a module the user named: imported, then its class's file hashed
        cls = load_attention_class(spec)
        path = class_file(cls)
        if path is None:
            raise ConfigError(f"{flag} {spec!r}: its class has no source file to record")
        digest = check(path)
    _named[(digest, name)] = cls
    return {"spec": spec, "path": str(path), "sha256": digest}


def check_recorded(spec: str, recorded) -> None:
    """A recorded attention_source (a checkpoint's: data, never trusted) has the shape the product writes: one
    ConfigError line otherwise. Reads no file and imports nothing."""
    fields = ("spec", "path", "sha256")
    if not (isinstance(recorded, dict) and set(recorded) == set(fields)
            and all(isinstance(recorded[k], str) for k in fields)):
        raise ConfigError(f"attention_source must be {{'spec', 'path', 'sha256'}} strings (recorded by the "
                          f"product; leave it unset), got {recorded!r:.200}")
    if recorded["spec"] != spec or len(recorded["sha256"]) != 64:
        raise ConfigError(f"attention_source {recorded!r:.200} does not record attention {spec!r:.200}")
    split_spec(spec)


def named_class(source: dict) -> type[nn.Module] | None:
    """The class the user named in this process for a recorded source (its file's hash and its name), or None."""
    return _named.get((source["sha256"], split_spec(source["spec"])[1]))


def needs_naming(source: dict, flag: str) -> str:
    """The one line a command prints for a network of a user's class that nobody named: which class, which flag."""
    _, name = split_spec(source["spec"])
    file = PurePath(source["path"]).name or "FILE.py"
    return (f"this network uses a user's attention class, {name} of a file {file} (sha256 {source['sha256'][:12]}…), "
            f"and a checkpoint never imports code by itself: name the class with {flag} path/to/{file}:{name}")


def named_network(network: dict, spec: str | None, *, flag: str, allow_changed: bool = False,
                  override: str = f"set {ALLOW_CHANGED}=1") -> dict:
    """A checkpoint's network dict ready to build: when it uses a user's class, with the class the user named
    (`spec`, given with `flag`) recorded in it (name_class checks the name and the file's hash), else as it is.
    Without `spec`: one ConfigError line (needs_naming); `spec` for a built-in kind: refused, not ignored."""
    attention = network.get("attention")
    if not is_class_spec(attention):
        if spec is not None:
            raise ConfigError(f"{flag} {spec!r}: this network's attention is {attention!r}, a built-in kind: it takes "
                              f"no class (leave {flag} out)")
        return network
    recorded = network.get("attention_source")
    check_recorded(attention, recorded)
    if spec is None:
        raise ConfigError(needs_naming(recorded, flag))
    named = name_class(spec, recorded, flag=flag, allow_changed=allow_changed, override=override)
    return network | {"attention_source": {"spec": attention, "path": named["path"], "sha256": named["sha256"]}}


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
    """The class a NetworkConfig's attention_source records, if the user named it in this process (name_class);
    else one ConfigError line: a recorded spec or path is never imported."""
    cls = named_class(config.attention_source)
    if cls is None:
        raise ConfigError(needs_naming(config.attention_source, "--attention-class (train.py: "
                                                                  "--model.network.attention; the API: attention=)"))
    return cls


def check_output_dtype(layer: nn.Module, user: nn.Module, d_model: int, name: str) -> None:
    """One ConfigError line unless the user's module (`user`, inside the adapter `layer`) answers a batch in torch's
    default dtype with that dtype (a class that returns float64 would stop training at its first matrix product
    with the network's float32)."""
    x = torch.randn(2, 5, d_model, generator=torch.Generator().manual_seed(0))
    seen = []
    handle = user.register_forward_hook(lambda module, args, output: seen.append(
        output[0] if isinstance(output, (tuple, list)) else output))
    was_training = layer.training
    layer.eval()
    try:
        with torch.no_grad():
            layer(x)
    except Exception:  # a product projection refusing its float64 (checked below); else the probes report it
        pass
    finally:
        handle.remove()
        layer.train(was_training)
    dtype = getattr(seen[0], "dtype", x.dtype) if seen else x.dtype
    if dtype != x.dtype:
        raise ConfigError(f"attention {name}: forward returns {dtype} for a {x.dtype} input (the network runs in "
                          f"{x.dtype}): return the output in the input's dtype (compute in it, or out.to(x.dtype))")


def long_input_problem(layer: nn.Module, d_model: int, length: int) -> str | None:
    """What goes wrong when the layer reads texts of `length` tokens (the run's max_length): None, or one line (an
    error it raises, NaN or infinity in a real token's output). A class that works on the short probes may break
    past a length (an allocation, a fixed-size table, a bad mask); training must not find out mid-epoch."""
    x = torch.randn(2, length, d_model, generator=torch.Generator().manual_seed(0))
    padding = torch.zeros(2, length, dtype=torch.bool)
    padding[1, max(1, length // 2):] = True  # one full text, one half as long
    was_training = layer.training
    layer.eval()
    try:
        with torch.no_grad():
            out, _ = guarded(lambda: layer(x, padding))
    except Exception as error:  # the user's forward
        return f"a text of {length} tokens: {first_line(error)}"
    finally:
        layer.train(was_training)
    if not torch.isfinite(out[~padding]).all():
        return f"a text of {length} tokens: its output holds NaN or infinity"
    return None


def first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
