"""How a user's attention class takes its mask, found by running it (layer.py), never from names.

Users write masks every way: bool True = padding (PyTorch's key_padding_mask), bool True = keep, 1/0 keep (float or
long, Hugging Face's attention_mask), additive 0 / −∞, 0 / −1e4 or 0 / −1e9 (BERT's extended mask), shaped (B, L),
(B, 1, 1, L) or (B, L, L); passed as forward(x, mask) or by keyword (mask=, key_padding_mask=, attention_mask=,
attn_mask=). The probe runs a small random batch in which some texts end in padding (random vectors, not zeros)
under each candidate and keeps the first under which every real token's output equals that of its text run alone
without padding (and, where the mask may be left out, equals it run with no mask at all: a mask that keeps every
key changes nothing), padded keys get weight 0 and nothing is NaN. A class whose forward takes no mask, or under which
no candidate works, is "no mask": the adapter then runs texts of one length together, unless it is causal (no
output depends on a later token: padding at the end is then out of every real token's view). Weights it does not
return are read as weights_seen.py says (an attribute, the softmax it computes, a fused call answered by the
written formula). forward(query, key, value, mask) is called as self-attention, x given for all three.

Letters in the shape comments: B batch, L tokens, H heads, D model width, W the class's output width.
"""

import inspect
from typing import NamedTuple

import torch
from torch import nn

from model.errors import ConfigError
from model.own_attention.naming import first_line
from model.own_attention.weights_seen import ATTRIBUTE, RETURNED, WeightsSeen, attribute_weights, attributes_now

MASK_NAMES = ("mask", "key_padding_mask", "attention_mask", "attn_mask", "src_key_padding_mask", "padding_mask")
INPUT_NAMES = ({"query", "q", "queries", "x_q"}, {"key", "k", "keys"}, {"value", "v", "values"})
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
    one_text: bool = False  # forward takes one text (L, D), not a batch: run text by text (the book's first classes)

    def describe(self) -> str:
        if self.one_text:
            return ("takes one text at a time, (L, D) (found by probing: a batch fails): run text by text, at its "
                    "own length, so no key it sees is padding")
        if self.call == "none":
            return ("takes no mask (found by probing): texts of one length are run together at that length, "
                    "so no key it sees is padding")
        call = "forward(x, mask)" if self.call == "positional" else f"forward(x, {self.call}=mask)"
        return f"mask found by probing: {call}, {self.kind}, shape {self.shape}"


class Found(NamedTuple):
    convention: Convention
    heads: int  # H of its weights ((B, L, L): 1)
    width: int  # W, its output width
    returns_weights: bool  # False: its weights are read as weights_seen.py says
    weights_from: str = RETURNED  # how: returned, an attribute, a softmax seen, a fused call recomputed (None: not)
    causal: bool = False  # no output depends on a later token (a look-ahead mask inside the class)
    weights_not_used: Convention | None = None  # a convention under which the output ignores padding but the
    # weights handed out do not (they are not the weights used)


def run_layer(user: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, convention: Convention,
              read_softmax: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(out, weights) of the class on x; read_softmax: weights it does not return are read (weights_seen.py)."""
    out, weights, _ = run_seen(user, x, mask, convention, read_softmax)
    return out, weights


def run_seen(user: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, convention: Convention,
             read_softmax: bool = True):
    """(out, weights, where the weights came from) of the class on x: returned, else (read_softmax) an attribute it
    sets, the softmax it computes, or a fused call answered by the formula; (out, None, None) when none."""
    if not read_softmax:
        out, weights = split_output(call_layer(user, x, mask, convention))
        return out, weights, RETURNED if weights is not None else None
    return weights_of_run(user, x, lambda: split_output(call_layer(user, x, mask, convention)))


def key_mask(padding: torch.Tensor, convention: Convention, dtype: torch.dtype) -> torch.Tensor:
    """padding (B, L) bool, True at padded keys → the mask in the class's convention and shape."""
    mask = KINDS[convention.kind](padding.bool(), dtype)  # (B, L)
    if convention.shape == "(B, 1, 1, L)":
        return mask[:, None, None, :]
    if convention.shape == "(B, L, L)":
        return mask[:, None, :].expand(-1, mask.shape[1], -1)  # row i: the keys query i may not see (or keeps)
    return mask


def inputs_taken(user: nn.Module) -> int:
    """3 for forward(query, key, value, …), called as self-attention with x for all three; else 1."""
    names = [p.name.lower() for p in list(inspect.signature(user.forward).parameters.values())[:3]]
    return 3 if len(names) == 3 and all(n in words for n, words in zip(names, INPUT_NAMES)) else 1


def call_layer(user: nn.Module, x: torch.Tensor, mask: torch.Tensor | None, convention: Convention):
    if convention.one_text:
        return text_by_text(user, x)
    inputs = (x,) * inputs_taken(user)
    if convention.call == "none" or mask is None:
        return user(*inputs)
    if convention.call == "positional":
        return user(*inputs, mask)
    return user(*inputs, **{convention.call: mask})


def bare(user: nn.Module, x: torch.Tensor, one_text: bool = False):
    """The class on x with no mask argument."""
    return call_layer(user, x, None, Convention("none", one_text=one_text))


def text_by_text(user: nn.Module, x: torch.Tensor):
    """A class whose forward takes one text (L, D), on each text of x (B, L, D): (out (B, L, W), weights (B, L, L)
    as it returns them or as its softmax gives them, or None)."""
    outs, weights = [], []
    for text in x:
        with WeightsSeen(1, text.shape[0]) as seen:
            out, returned = split_output(user(*(text,) * inputs_taken(user)))
        outs.append(out)
        weights.append(returned if returned is not None else seen.weights)
    ok = all(w is not None and w.shape[-2:] == weights[0].shape[-2:] for w in weights)
    return torch.stack(outs), torch.stack([w.reshape(-1, *w.shape[-2:]).squeeze(0) for w in weights]) if ok else None


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
    rest = parameters[inputs_taken(user):]
    keywords = [p.name for p in rest if p.name in MASK_NAMES and p.kind is not p.POSITIONAL_ONLY]
    positional = [p for p in rest if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    calls = keywords or (["positional"] if positional else [])
    used = set(keywords[:1]) if keywords else {positional[0].name} if positional else set()
    for p in rest:
        if p.name not in used and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise ConfigError(f"attention {name}: forward needs {p.name!r}, which the product cannot give; expected "
                              f"forward(x), forward(x, mask), forward(query, key, value, mask) or "
                              f"forward(x, {'/'.join(MASK_NAMES)}=...)")
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
        one_text = False
        try:
            try:
                out, weights, source = plain_run(user, x, calls)
            except Exception:  # a batch fails: a class written for one text (L, D) at a time?
                if calls:
                    raise
                out, weights, source = plain_run(user, x, calls, one_text=True)
                one_text, source = True, "a softmax seen" if source else None
        except Exception as error:  # the user's forward
            error = error.__context__ if one_text is False and error.__context__ is not None else error
            raise ConfigError(f"attention {name}: forward on x of shape (B, L, D) = {tuple(x.shape)} failed: "
                              f"{first_line(error)}; expected forward(x) or forward(x, mask) returning out "
                              "(B, L, W) or (out, weights (B, [H,] L, L))") from None
        heads, width = read_shapes(out, weights, B, L, name)
        returned = source == RETURNED
        if one_text:
            causal = looks_ahead_never(user, x, calls, one_text=True)
            return Found(Convention("none", one_text=True), heads, width, False, source, causal)
        causal = looks_ahead_never(user, x, calls)
        leaky = None
        for convention in candidates(calls):
            found = judge(user, x, padding, convention, read_softmax=not returned)
            if found == WORKS:
                return Found(convention, heads, width, returned, source, causal)
            leaky = leaky or (convention if found == WEIGHTS_NOT_USED else None)
        if calls and mask_required(user, calls[0]):
            raise NoConvention(f"attention {name}: forward needs its mask, but under no convention tried did a text's "
                              "output stay the same with padding added (tried bool True = padding or keep, 1/0 keep, "
                              "additive 0 / -inf, -1e4, -1e9; shapes (B, L), (B, 1, 1, L), (B, L, L))")
        return Found(Convention("none"), heads, width, returned, source, causal, leaky)
    finally:
        user.train(was_training)


def candidates(calls: list[str]):
    return [Convention(call, kind, shape) for call in calls for shape in SHAPES for kind in KINDS]


def plain_run(user: nn.Module, x: torch.Tensor, calls: list[str], one_text: bool = False):
    """(out, weights, where they came from) of the class on x with no padding: forward(x) when the mask may be
    left out, else with a mask that keeps every key in the first convention the class accepts. Weights it does not
    return are read as weights_seen.py says (None, None when they cannot be seen)."""
    return weights_of_run(user, x, lambda: mask_free_run(user, x, calls, one_text))


def weights_of_run(user: nn.Module, x: torch.Tensor, run):
    """(out, weights, where they came from) of run() -> (out, weights or None): the weights it returns, else an
    attribute the class set during the call, else the softmax or fused call weights_seen.py saw."""
    before = attributes_now(user)
    with WeightsSeen(x.shape[0], x.shape[1]) as seen:
        out, weights = run()
    if weights is not None:
        return out, weights, RETURNED
    kept = attribute_weights(user, before, x.shape[0], x.shape[1])
    if kept is not None:
        return out, kept, ATTRIBUTE
    return out, seen.weights, seen.source


def looks_ahead_never(user: nn.Module, x: torch.Tensor, calls: list[str], one_text: bool = False) -> bool:
    """Whether no output depends on a later token: the last tokens changed, the outputs before them stay (to
    rounding) and the last ones move. A layer whose outputs do not move at all is not called causal."""
    try:
        out = mask_free_run(user, x, calls, one_text)[0]
        later = x.clone()
        later[:, -2:] = torch.randn(later[:, -2:].shape, generator=torch.Generator().manual_seed(1)).to(x)
        moved = mask_free_run(user, later, calls, one_text)[0]
    except Exception:  # the user's forward: probing causality is best effort
        return False
    if out.shape != moved.shape or not torch.isfinite(out[:, :-2]).all():
        return False
    return bool(torch.allclose(out[:, :-2], moved[:, :-2], atol=TOLERANCE, rtol=TOLERANCE)
                and not torch.allclose(out[:, -2:], moved[:, -2:], atol=TOLERANCE, rtol=TOLERANCE))


def mask_free_run(user: nn.Module, x: torch.Tensor, calls: list[str], one_text: bool = False):
    if not calls or not mask_required(user, calls[0]):
        return split_output(bare(user, x, one_text))
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
    rest = list(inspect.signature(user.forward).parameters.values())[inputs_taken(user):]
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
    return judge(user, x, padding, convention, read_softmax) == WORKS


WORKS, WEIGHTS_NOT_USED = "works", "the weights handed out are not the weights used"


def judge(user: nn.Module, x: torch.Tensor, padding: torch.Tensor, convention: Convention,
          read_softmax: bool = False) -> str:
    """WORKS; WEIGHTS_NOT_USED where every output is right but the weights handed out give padded keys weight;
    "" otherwise."""
    try:
        out, weights = run_layer(user, x, key_mask(padding, convention, x.dtype), convention, read_softmax)
        if out.shape[:2] != x.shape[:2]:  # the mask broadcast into the batch or token axis
            return ""
        for row, length in enumerate((~padding).sum(dim=-1).tolist()):
            alone = x[row:row + 1, :length]
            keep_all = key_mask(padding[row:row + 1, :length] & False, convention, x.dtype)
            expected, _ = split_output(call_layer(user, alone, keep_all, convention))
            if not torch.allclose(out[row, :length], expected[0], atol=TOLERANCE, rtol=TOLERANCE):
                return ""
            if not mask_required(user, convention.call):  # a mask that keeps every key must change nothing
                plain, _ = split_output(bare(user, alone))
                if not torch.allclose(plain, expected, atol=TOLERANCE, rtol=TOLERANCE):
                    return ""
        if weights is not None:
            weights = weights if weights.dim() == 4 else weights.unsqueeze(1)  # (B, H, L, L)
            on_padding = weights.masked_fill(~padding[:, None, None, :], 0.0)  # the padded keys' columns
            on_padding = on_padding.masked_fill(padding[:, None, :, None], 0.0)  # from real queries only
            if not bool(on_padding.abs().max() <= TOLERANCE):
                return WEIGHTS_NOT_USED if bool(torch.isfinite(out).all()) else ""
        # Finite everywhere, padded queries included: a NaN row (an additive -inf on a row with no key left) would
        # send NaN gradients into every weight through the softmax's backward.
        finite = bool(torch.isfinite(out).all()) and (weights is None or bool(torch.isfinite(weights).all()))
        return WORKS if finite else ""
    except Exception:  # a convention the class cannot take (a bool mask added to floats, a wrong shape): not it
        return ""


@torch.no_grad()
def runs(user: nn.Module, d_model: int) -> bool:
    """Whether the class runs on a (B, L, d_model) batch as self-attention and returns out (B, L, W), finite."""
    x = torch.randn(len(PROBE_LENGTHS), max(PROBE_LENGTHS), d_model, generator=torch.Generator().manual_seed(0))
    was_training = user.training
    user.eval()
    try:
        out, _ = mask_free_run(user, x, mask_calls(user, type(user).__name__))
        return out.dim() == 3 and out.shape[:2] == x.shape[:2] and bool(torch.isfinite(out).all())
    except Exception:  # the user's forward under this choice of sizes: not this one
        return False
    finally:
        user.train(was_training)
