"""A user's attention class built from the network's sizes (layer.py builds its layers with it):
its constructor read by parameter names, a `config` object (nanoGPT's GPTConfig, minGPT's CfgNode) made as an
attribute namespace of the same sizes, and names that can mean two sizes (d_out: the output width or one head's)
resolved by probing.

    constructor_choices(cls, ...)   the keyword arguments it may be built with, the likeliest first
    build_user_layer(cls, ...)      the first of them under which it builds and runs
"""

import inspect
import itertools
import weakref
from types import SimpleNamespace

import torch
from torch import nn

from model.errors import ConfigError
from model.own_attention.naming import ARGS_FLAG, first_line, guarded

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
CONFIG_EXTRA = {"bias": True, "qkv_bias": False}  # what GPT-style configs also read, at their usual defaults
CONTEXT_LENGTH = 512  # the longest text a class with a fixed look-ahead buffer (block_size) is built for
# Constructor parameters that hold an object (a config dataclass, an argparse namespace): they get an attribute
# namespace of the network's sizes under every name of SIZE_NAMES (config_object).
OBJECT_NAMES = ("config", "cfg", "configuration", "conf", "args", "model_args", "params", "hparams", "opt", "options")
_built: "weakref.WeakKeyDictionary[nn.Module, tuple[dict, dict]]" = weakref.WeakKeyDictionary()  # built_with

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


def constructor_arguments(cls: type, d_model: int, n_heads: int, d_head: int, args: dict | None = None,
                          args_flag: str = ARGS_FLAG) -> dict:
    """The keyword arguments cls(**them) is built with, the first of constructor_choices."""
    return constructor_choices(cls, d_model, n_heads, d_head, args, args_flag)[0]


def constructor_choices(cls: type, d_model: int, n_heads: int, d_head: int, args: dict | None = None,
                        args_flag: str = ARGS_FLAG) -> list[dict]:
    """The keyword arguments cls(**them) may be built with, the likeliest first: each parameter named like a size
    (SIZE_NAMES) gets the network's (names that can mean two sizes, each in turn), a parameter named like an object
    (OBJECT_NAMES) a namespace holding them, `args` (attention_args) gives or overrides any; a required one nobody
    fills is a ConfigError line naming `args_flag`, the option of the command that gives attention_args
    (diagnose.py --attention: --args)."""
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
        is_object = name.lower() in OBJECT_NAMES
        if name in args and not (is_object and isinstance(args[name], dict)):
            options[name] = [args[name]]
        elif name in sizes and (required or name not in SIZE_NAMES["dropout"] + SIZE_NAMES["length"]):
            options[name] = sizes[name]
        elif is_object and (required or name in args):
            options[name] = [config_object(args.get(name), sizes)]
        elif required:
            raise ConfigError(f"attention: {cls.__name__}.__init__ needs {name!r}, which no network setting fills: "
                              f"give it with {args_flag} '{{\"{name}\": ...}}'")
    names = list(options)
    return [dict(zip(names, values)) for values in itertools.islice(itertools.product(*options.values()), 16)]


def build_user_layer(cls: type, d_model: int, n_heads: int, d_head: int, args: dict | None = None,
                     args_flag: str = ARGS_FLAG, runs=None) -> nn.Module:
    """cls built from the network's sizes and attention_args: the first of constructor_choices under which it
    builds and `runs(module, d_model)` says it runs (mask_probe.py's `runs`, given by the adapter), else the
    first that builds. A constructor that raises under every choice (sys.exit included) is one ConfigError line (the
    first choice's), and so is one that leaves anything but the network's dtype behind: torch's default dtype
    changed (set back first), or floating parameters and buffers of another dtype."""
    choices = constructor_choices(cls, d_model, n_heads, d_head, args, args_flag)
    first_built, first_error = None, None
    for arguments in choices:
        layer = built_once(cls, arguments, args_flag)
        if isinstance(layer, Exception):
            first_error = first_error or (arguments, layer)
            continue
        if len(choices) == 1 or runs is None or runs(layer, d_model):
            _built.setdefault(layer, (arguments, choices[0]))  # a factory of a built module keeps its record
            return layer
        first_built = first_built or (layer, arguments)
    if first_built is not None:
        _built.setdefault(first_built[0], (first_built[1], choices[0]))
        return first_built[0]
    arguments, error = first_error
    if isinstance(error, ConfigError):
        raise error
    shown = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    missing = object_attribute_missing(error, arguments)
    hint = f": give it with {args_flag} '{{\"{missing[0]}\": {{\"{missing[1]}\": ...}}}}'" if missing else ""
    raise ConfigError(f"attention: {cls.__name__}({shown}) failed: {first_line(error)}{hint}")


def built_with(layer: nn.Module) -> tuple[dict, dict] | None:
    """(the keyword arguments build_user_layer built `layer` with, the likeliest choice it tried first), or None
    for a module it did not build. The doctor rebuilds the class from them (monitor/layer_behaviour.py: with its
    dropout on; the network's head count where another was kept)."""
    return _built.get(layer)


def dropout_arguments(cls: type, arguments: dict, rate: float) -> dict | None:
    """The same arguments with every dropout rate of SIZE_NAMES set to `rate`: a parameter given or left at a
    numeric default, or an attribute of a config namespace given; None when the constructor takes none."""
    names = set(SIZE_NAMES["dropout"])
    parameters = list(inspect.signature(cls.__init__).parameters.values())[1:]
    defaults = {p.name: p.default for p in parameters if p.name in names and p.name not in arguments}
    changed = {name: rate for name, default in defaults.items()
               if isinstance(default, (int, float)) and not isinstance(default, bool)}
    for name, value in arguments.items():
        if name in names and isinstance(value, (int, float)) and not isinstance(value, bool):
            changed[name] = rate
        elif isinstance(value, SimpleNamespace) and names & set(vars(value)):
            changed[name] = SimpleNamespace(**{k: rate if k in names else v for k, v in vars(value).items()})
    return {**arguments, **changed} if changed else None


def built_once(cls: type, arguments: dict, args_flag: str):
    """cls(**arguments), or the exception its constructor raised; a dtype it leaves behind is a ConfigError."""
    dtype = torch.get_default_dtype()
    try:
        layer = guarded(lambda: cls(**arguments))
    except Exception as error:  # the user's constructor: the caller reports it, or tries the next choice
        return error
    finally:
        changed = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # the process's setting, whatever the class did to it
    if changed != dtype:
        raise ConfigError(f"attention: {cls.__name__}.__init__ changed torch's default dtype to {changed} (the "
                          f"network runs in {dtype}; set back): remove torch.set_default_dtype from the class")
    other = [f"{name} ({t.dtype})" for name, t in (*layer.named_parameters(), *layer.named_buffers())
             if t.is_floating_point() and t.dtype != dtype]
    if other:
        raise ConfigError(f"attention: {cls.__name__} holds {', '.join(other[:3])}{', ...' if len(other) > 3 else ''}"
                          f" while the network runs in {dtype}: create them in {dtype} (no dtype=, no .double())")
    return layer


def object_attribute_missing(error: Exception, arguments: dict) -> tuple[str, str] | None:
    """(parameter, attribute) when the constructor read an attribute its config namespace does not hold."""
    name = getattr(error, "name", None)
    if isinstance(error, AttributeError) and name:
        for parameter, value in arguments.items():
            if isinstance(value, SimpleNamespace) and getattr(error, "obj", None) is value:
                return parameter, name
    return None
