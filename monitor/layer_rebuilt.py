"""What the product's own build of a user's class hides, seen by building the class again with other constructor
arguments (model/own_attention/constructor.py records the ones it was built with) and running it beside the probed one:

    with_dropout        the class built with every dropout rate its constructor takes at DROPOUT_RATE: the product
                        builds it with 0, under which dropout that runs in evaluation drops nothing (eval-steady)
    heads_along_tokens  the class built with the network's head count where the adapter kept another: H·L rows for L
                        tokens are the heads' outputs stacked along the tokens, which one head hides (shapes)

Each leaves torch's random stream as it was, so the other checks read what they read without it.
"""

from types import SimpleNamespace

import torch

from model.own_attention import SIZE_NAMES, built_once, built_with, dropout_arguments, mask_calls, mask_free_run
from monitor.layer_probe import Probe

DROPOUT_RATE = 0.5  # the rate the eval-steady check builds a class with, where its constructor takes one


def with_dropout(probe: Probe):
    """(what it was built with, out, out again): two evaluation passes on the probe batch of the user's class built
    again with every dropout rate its constructor takes at DROPOUT_RATE, the probed module's weights loaded, its
    own forward run (no weights asked: a fused kernel runs as it is). None for a built-in kind, a module the product
    did not build, a constructor that takes no rate or fails with this one."""
    if probe.user is probe.layer:  # a kind of the product: nothing built from a user's class
        return None
    record = built_with(probe.user)
    arguments = record and dropout_arguments(type(probe.user), record[0], DROPOUT_RATE)
    if not arguments:
        return None
    rates = ", ".join(f"{name}={DROPOUT_RATE:g}" if not isinstance(value, SimpleNamespace) else
                      f"{name}'s dropout rates at {DROPOUT_RATE:g}" for name, value in arguments.items()
                      if value is not record[0].get(name))
    mask = probe.padding if probe.takes_mask and probe.padding.any() else None
    layer, user = probe.layer, probe.user
    with torch.random.fork_rng(), torch.no_grad():
        twin = built_once(type(user), arguments, "--args")
        try:
            if isinstance(twin, Exception):
                return None
            twin.load_state_dict(user.state_dict())
        except Exception:  # the user's constructor or state: another structure at this rate, no twin
            return None
        was_training = layer.training
        layer.user = twin
        layer.eval()
        try:
            first, second = (layer(probe.x, key_padding_mask=mask, need_weights=False)[0] for _ in range(2))
        except Exception:  # the user's forward at this rate: the other checks judge it as built
            return None
        finally:
            layer.user = user
            layer.train(was_training)
    real = probe.real()
    return rates, first[real], second[real]


def heads_along_tokens(probe: Probe) -> str:
    """A class the adapter took with another head count than the network's because, built with the network's H
    heads, it returns H·L rows for L tokens: the heads' outputs stacked along the tokens (torch.cat(..., dim=1)),
    which one head hides. "" otherwise (a class that raises with H heads, or returns another shape, is left alone)."""
    record = None if probe.user is probe.layer else built_with(probe.user)
    if record is None or record[0] == record[1]:
        return ""
    kept, asked = record
    differ = {name for name in kept if kept[name] is not asked.get(name) and kept[name] != asked.get(name)}
    heads = [asked[name] for name in differ if name in SIZE_NAMES["n_heads"]]
    if not heads or len(differ) != 1 or heads[0] < 2:
        return ""
    B, L = probe.x.shape[:2]
    with torch.random.fork_rng(), torch.no_grad():
        layer = built_once(type(probe.user), asked, "--args")
        if isinstance(layer, Exception):
            return ""
        try:
            out, _ = mask_free_run(layer.eval(), probe.x, mask_calls(layer, type(layer).__name__))
        except Exception:  # the user's forward with the network's heads: not this finding
            return ""
    if not torch.is_tensor(out) or out.dim() != 3 or tuple(out.shape[:2]) != (B, heads[0] * L):
        return ""
    name = next(iter(differ))
    return (f"built with the network's {heads[0]} heads ({name}={heads[0]}) it returns out {tuple(out.shape)} for "
            f"(B, L) = ({B}, {L}): {heads[0]} × L rows, the heads' outputs stacked along the tokens (torch.cat(..., "
            f"dim=1) where dim=-1 was meant); the product could take it only with {name}={kept[name]}")
