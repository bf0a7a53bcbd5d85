"""How a user's attention class takes its mask, found by running it (model/own_attention.py), never from names.

Users write masks every way: bool True = padding (PyTorch's key_padding_mask), bool True = keep, 1/0 keep (float or
long, Hugging Face's attention_mask), additive 0 / −∞, 0 / −1e4 or 0 / −1e9 (BERT's extended mask), shaped (B, L),
(B, 1, 1, L) or (B, L, L); passed as forward(x, mask) or by keyword (mask=, key_padding_mask=, attention_mask=,
attn_mask=). The probe runs a small random batch in which some texts end in padding (random vectors, not zeros)
under each candidate and keeps the first under which every real token's output equals that of its text run alone
without padding (and, where the mask may be left out, equals it run with no mask at all: a mask that keeps every
key changes nothing), padded keys get weight 0 and nothing is NaN. A class whose forward takes no mask, or under which
no candidate works, is "no mask": the adapter then runs texts of one length together. A class that returns only its
output has its weights read from the softmax it computes (SoftmaxSeen): the weights it used, never recomputed.

Letters in the shape comments: B batch, L tokens, H heads, D model width, W the class's output width.
"""

import inspect
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from model.errors import ConfigError
from model.user_class import first_line

MASK_NAMES = ("mask", "key_padding_mask", "attention_mask", "attn_mask")
KINDS = {  # how a convention writes "this key is padding", by name
    "bool True = padding": lambda padding, dtype: padding,
    "bool True = keep": lambda padding, dtype: ~padding,
    "1/0 keep (float)": lambda padding, dtype: (~padding).to(dtype),
    "1/0 keep (long)": lambda padding, dtype: (~padding).long(),
    "additive 0 / -inf": lambda padding, dtype: additive(padding, dtype, float("-inf")),
    "additive 0 / -1e4": lambda padding, dtype: additive(padding, dtype, -1e4),
    "additive 0 / -1e9": lambda padding, dtype: additive(padding, dtype, -1e9),
}
SHAPES = ("(B, L)", "(B, 1, 1, L)", "(B, L, L)")
PROBE_LENGTHS = (7, 5, 2)  # a batch of 3 texts of 7 places: B, L and the heads rarely coincide, so a wrong
# broadcast fails instead of passing by chance
TOLERANCE = 1e-4  # float32 rounding of a tiny layer is ~1e-6


class NoConvention(ConfigError):
    """forward must be given a mask, and under no convention tried does padding leave a text's output alone."""


def additive(padding: torch.Tensor, dtype: torch.dtype, value: float) -> torch.Tensor:
    return torch.zeros(padding.shape, dtype=dtype, device=padding.device).masked_fill(padding, value)


class Convention(NamedTuple):
    call: str  # "none" (forward(x)), "positional" (forward(x, mask)) or the keyword forward takes the mask by
    kind: str = ""  # a name of KINDS
    shape: str = ""  # one of SHAPES

    def describe(self) -> str:
        if self.call == "none":
            return ("takes no mask (found by probing): texts of one length are run together at that length, "
                    "so no key it sees is padding")
        call = "forward(x, mask)" if self.call == "positional" else f"forward(x, {self.call}=mask)"
        return f"mask found by probing: {call}, {self.kind}, shape {self.shape}"


class Found(NamedTuple):
    convention: Convention
    heads: int  # H of its weights ((B, L, L): 1)
    width: int  # W, its output width
    returns_weights: bool  # False: its weights are read from the softmax it computes (SoftmaxSeen)


SOFTMAXES = (torch.softmax, torch.Tensor.softmax, F.softmax, torch.special.softmax)


class SoftmaxSeen(TorchFunctionMode):
    """Keeps the last softmax a forward computes whose output is (B, L, L) or (B, H, L, L) for L = `length`: the
    weights of a class that returns only its output, as the class itself computed them."""

    def __init__(self, batch: int, length: int):
        super().__init__()
        self.batch, self.length, self.weights = batch, length, None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in SOFTMAXES and isinstance(out, torch.Tensor) and out.dim() in (3, 4) \
                and out.shape[0] == self.batch and out.shape[-2:] == (self.length, self.length):
            self.weights = out
        return out


def run_layer(user: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, convention: Convention,
              read_softmax: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, weights) of the class on x; read_softmax: weights it does not return are read from its softmax."""
    if not read_softmax:
        return split_output(call_layer(user, x, mask, convention))
    with SoftmaxSeen(x.shape[0], x.shape[1]) as seen:
        out, weights = split_output(call_layer(user, x, mask, convention))
    return out, seen.weights if weights is None else weights


def key_mask(padding: torch.Tensor, convention: Convention, dtype: torch.dtype) -> torch.Tensor:
    """padding (B, L) bool, True at padded keys → the mask in the class's convention and shape."""
    mask = KINDS[convention.kind](padding.bool(), dtype)  # (B, L)
    if convention.shape == "(B, 1, 1, L)":
        return mask[:, None, None, :]
    if convention.shape == "(B, L, L)":
        return mask[:, None, :].expand(-1, mask.shape[1], -1)  # row i: the keys query i may not see (or keeps)
    return mask


def call_layer(user: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, convention: Convention):
    if convention.call == "none" or mask is None:
        return user(x)
    if convention.call == "positional":
        return user(x, mask)
    return user(x, **{convention.call: mask})


def split_output(result) -> tuple[torch.Tensor, torch.Tensor | None]:
    """out, or (out, weights): (out (B, L, W), weights (B, L, L) / (B, H, L, L) or None)."""
    if isinstance(result, torch.Tensor):
        return result, None
    if isinstance(result, (tuple, list)) and len(result) > 2:  # (out, weights, scores): not guessed at
        raise TypeError(f"forward returned {len(result)} values; expected out or (out, weights)")
    if isinstance(result, (tuple, list)) and result and isinstance(result[0], torch.Tensor):
        weights = result[1] if len(result) > 1 and isinstance(result[1], torch.Tensor) else None
        return result[0], weights
    raise TypeError(f"forward returned {type(result).__name__}; expected out or (out, weights)")


def mask_calls(user: nn.Module, name: str) -> list[str]:
    """How forward can take a mask: the keywords it names, else "positional" for a second parameter; [] if none.
    A required parameter it has beyond x and the mask is a ConfigError line."""
    parameters = list(inspect.signature(user.forward).parameters.values())
    if not parameters or parameters[0].kind in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
        raise ConfigError(f"attention {name}: forward takes no input x; expected forward(x) or forward(x, mask)")
    rest = parameters[1:]
    keywords = [p.name for p in rest if p.name in MASK_NAMES and p.kind is not p.POSITIONAL_ONLY]
    positional = [p for p in rest if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    calls = keywords or (["positional"] if positional else [])
    used = set(keywords[:1]) if keywords else {positional[0].name} if positional else set()
    for p in rest:
        if p.name not in used and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigError(f"attention {name}: forward needs {p.name!r}, which the product cannot give; expected "
                              f"forward(x), forward(x, mask) or forward(x, {'/'.join(MASK_NAMES)}=...)")
    return calls


@torch.no_grad()
def find_convention(user: nn.Module, d_model: int, name: str) -> Found:
    """Runs the class on a probe batch (evaluation mode, its own random stream: the caller's is left as it was) and
    returns how it takes its mask, its heads and output width. A forward that fails on the plain input, or returns
    what the product cannot read, is a ConfigError line saying the signature expected."""
    generator = torch.Generator().manual_seed(0)
    B, L = len(PROBE_LENGTHS), max(PROBE_LENGTHS)
    x = torch.randn(B, L, d_model, generator=generator)  # (B, L, D): padded places hold random vectors too
    padding = torch.arange(L)[None] >= torch.tensor(PROBE_LENGTHS)[:, None]  # (B, L) True at padding
    parameter = next(user.parameters(), None)
    if parameter is not None:
        x, padding = x.to(parameter.device, parameter.dtype), padding.to(parameter.device)
    calls = mask_calls(user, name)
    was_training = user.training
    user.eval()
    try:
        try:
            out, weights, returned = plain_run(user, x, calls)
        except Exception as error:  # the user's forward
            raise ConfigError(f"attention {name}: forward on x of shape (B, L, D) = {tuple(x.shape)} failed: "
                              f"{first_line(error)}; expected forward(x) or forward(x, mask) returning out "
                              "(B, L, W) or (out, weights (B, [H,] L, L))") from None
        heads, width = read_shapes(out, weights, B, L, name)
        if weights is None:
            raise ConfigError(f"attention {name}: forward returns no weights and computes no softmax of shape "
                              "(B, [H,] L, L) the product can see (a fused kernel?): return (out, weights) so that "
                              "its heatmaps and figures can be drawn")
        for convention in candidates(calls):
            if works(user, x, padding, convention, read_softmax=not returned):
                return Found(convention, heads, width, returned)
        if calls and mask_required(user, calls[0]):
            raise NoConvention(f"attention {name}: forward needs its mask, but under no convention tried did a text's "
                              "output stay the same with padding added (tried bool True = padding or keep, 1/0 keep, "
                              "additive 0 / -inf, -1e4, -1e9; shapes (B, L), (B, 1, 1, L), (B, L, L))")
        return Found(Convention("none"), heads, width, returned)
    finally:
        user.train(was_training)


def candidates(calls: list[str]):
    return [Convention(call, kind, shape) for call in calls for shape in SHAPES for kind in KINDS]


def plain_run(user: nn.Module, x: torch.Tensor, calls: list[str]):
    """(out, weights, returned) of the class on x with no padding: forward(x) when the mask may be left out, else
    with a mask that keeps every key in the first convention the class accepts. Weights it does not return
    (returned False) are read from the softmax it computes (None when none is seen)."""
    with SoftmaxSeen(x.shape[0], x.shape[1]) as seen:
        out, weights = mask_free_run(user, x, calls)
    return out, seen.weights if weights is None else weights, weights is not None


def mask_free_run(user: nn.Module, x: torch.Tensor, calls: list[str]):
    if not calls or not mask_required(user, calls[0]):
        return split_output(user(x))
    keep_all = torch.zeros(x.shape[:2], dtype=torch.bool, device=x.device)
    first_error = None
    for convention in candidates(calls):
        try:
            out, weights = split_output(call_layer(user, x, key_mask(keep_all, convention, x.dtype), convention))
        except Exception as error:  # a convention it refuses; the first error is the one reported
            first_error = first_error or error
            continue
        if out.dim() == 3 and out.shape[:2] == x.shape[:2]:  # a mask of another shape can broadcast without error
            return out, weights
        first_error = first_error or ValueError(f"out of shape {tuple(out.shape)} under {convention.describe()}")
    raise first_error


def mask_required(user: nn.Module, call: str) -> bool:
    """Whether forward must be given its mask (the parameter `call` names, or its second one, has no default)."""
    rest = list(inspect.signature(user.forward).parameters.values())[1:]
    parameter = rest[0] if call == "positional" else next(p for p in rest if p.name == call)
    return parameter.default is parameter.empty and parameter.kind is not parameter.VAR_POSITIONAL


def read_shapes(out, weights, B: int, L: int, name: str) -> tuple[int, int]:
    """(heads, output width) from a plain run's out and weights; a shape the product cannot read is one line."""
    expected = "expected out (B, L, W) and weights (B, L, L) or (B, H, L, L)"
    if out.dim() != 3 or out.shape[:2] != (B, L):
        raise ConfigError(f"attention {name}: forward returned out of shape {tuple(out.shape)} for x (B, L) = "
                          f"{(B, L)}; {expected}")
    if weights is None:
        return 1, out.shape[-1]
    if weights.dim() == 3 and weights.shape == (B, L, L):
        return 1, out.shape[-1]
    if weights.dim() == 4 and weights.shape[0] == B and weights.shape[2:] == (L, L):
        return weights.shape[1], out.shape[-1]
    raise ConfigError(f"attention {name}: forward returned weights of shape {tuple(weights.shape)} for (B, L) = "
                      f"{(B, L)}; {expected}")


def works(user: nn.Module, x: torch.Tensor, padding: torch.Tensor, convention: Convention,
          read_softmax: bool = False) -> bool:
    """Whether, under `convention`, each real token's output equals that of its text run alone at its own length,
    and padded keys get weight 0 from real queries (where weights are returned)."""
    try:
        out, weights = run_layer(user, x, key_mask(padding, convention, x.dtype), convention, read_softmax)
        if out.shape[:2] != x.shape[:2]:  # the mask broadcast into the batch or token axis
            return False
        for row, length in enumerate((~padding).sum(dim=-1).tolist()):
            alone = x[row:row + 1, :length]
            keep_all = key_mask(padding[row:row + 1, :length] & False, convention, x.dtype)
            expected, _ = split_output(call_layer(user, alone, keep_all, convention))
            if not torch.allclose(out[row, :length], expected[0], atol=TOLERANCE, rtol=TOLERANCE):
                return False
            if not mask_required(user, convention.call):  # a mask that keeps every key must change nothing
                bare, _ = split_output(user(alone))
                if not torch.allclose(bare, expected, atol=TOLERANCE, rtol=TOLERANCE):
                    return False
        if weights is not None:
            weights = weights if weights.dim() == 4 else weights.unsqueeze(1)  # (B, H, L, L)
            on_padding = weights.masked_fill(~padding[:, None, None, :], 0.0)  # the padded keys' columns
            on_padding = on_padding.masked_fill(padding[:, None, :, None], 0.0)  # from real queries only
            if not bool(on_padding.abs().max() <= TOLERANCE):
                return False
        # Finite everywhere, padded queries included: a NaN row (an additive -inf on a row with no key left) would
        # send NaN gradients into every weight through the softmax's backward.
        return bool(torch.isfinite(out).all()) and (weights is None or bool(torch.isfinite(weights).all()))
    except Exception:  # a convention the class cannot take (a bool mask added to floats, a wrong shape): not it
        return False
