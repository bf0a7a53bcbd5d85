"""The layer contract's behavioural checks (monitor/layer_contract.py lists them): what a working layer does, read
from its output and weights on the probe batch (monitor/layer_probe.py), never from its code. Each judges the
position-free, unmasked family; a family whose contract differs (causal, positions inside: monitor/layer_family.py)
judges those checks its own way."""

import math

import torch

from model.own_attention import inputs_taken, mask_calls
from monitor.layer_probe import MORE_PADDING, Outcome, Probe, Unusable, changed, figure, rounding
from monitor.layer_rebuilt import heads_along_tokens, with_dropout
from monitor.thresholds import INVARIANCE

STEADY = 1e-6  # relative change between two identical evaluation passes: exactly 0 for a deterministic layer
ROW_SUM = 1e-4  # |row sum − 1| of a real query's weights: float32 rounding gives ≤ 1e-6
STABLE_SCORES = 300.0  # the largest |score| the stability check drives the layer to: exp() overflows float32 past
# 88.7, so a softmax written as exp(s) / exp(s).sum() without the row maximum subtracted gives inf, then NaN
CALM = 1e-3  # the input's factor under which the look-ahead check reads each query's weight on its own token
NO_WEIGHTS = Outcome("NOTE", "the layer hands out no weights (return (output, weights) to get heatmaps and this check)")
PADDING_NAMES = ("key_padding_mask", "src_key_padding_mask", "padding_mask")  # PyTorch's: True = padding
KEEP_NAMES = ("attention_mask",)  # Hugging Face's: 1 = a token to attend to


def shapes(probe: Probe) -> Outcome:
    try:
        seen = probe.base
    except Unusable:
        return Outcome("FAIL", str(probe.cache["base"]))
    B, L = probe.x.shape[:2]
    parts, bad = [f"out {tuple(seen.out.shape)}"], []
    if tuple(seen.out.shape) != (B, L, probe.d_model):
        bad.append(f"the output is {tuple(seen.out.shape)}, not (B, L, D) = {(B, L, probe.d_model)}")
    if seen.raw_out is not None and seen.raw_out is not seen.out:
        parts.append(f"its own out {tuple(seen.raw_out.shape)}")
        if tuple(seen.raw_out.shape[:2]) != (B, L):
            bad.append(f"its own output is {tuple(seen.raw_out.shape)}, not (B, L, ·) = ({B}, {L}, ·)")
    raw = seen.raw_weights
    if raw is not None:
        parts.append(f"weights {tuple(raw.shape)}")
        if raw.ndim not in (3, 4) or raw.shape[0] != B or tuple(raw.shape[-2:]) != (L, L):
            bad.append(f"the weights are {tuple(raw.shape)}, not (B, L, L) or (B, H, L, L) with B={B}, L={L}")
    if not torch.isfinite(seen.out).all():
        bad.append("the output holds NaN or inf")
    refused = heads_along_tokens(probe)
    if refused:
        bad.append(refused)
    return Outcome("FAIL" if bad else "PASS", "; ".join(bad or parts))


def softmax_rows(probe: Probe) -> Outcome:
    weights = probe.base.weights
    if weights is None:
        return NO_WEIGHTS
    rows = weights[probe.real()[:, None].expand_as(weights[..., 0])]  # (real query rows, L)
    lowest, error = float(rows.min()), float((rows.sum(-1) - 1).abs().max())
    figures = {"lowest_weight": lowest, "row_sum_error": error}
    verdict = "FAIL" if lowest < 0 or not error < ROW_SUM else "PASS"
    return Outcome(verdict, f"lowest weight {figure(lowest)}, largest |row sum − 1| {rounding(error)}", figures)


def padding(probe: Probe) -> Outcome:
    if not probe.takes_mask:
        calls = mask_calls(probe.user, type(probe.user).__name__)
        if calls:  # its forward takes a mask, yet the adapter found no convention under which padding is ignored
            taken = "the second argument" if calls == ["positional"] else f"{calls[0]}="
            leaky = probe.layer.weights_not_used
            if leaky is not None:
                return Outcome("FAIL", f"the weights handed out are not the weights used: with the mask as "
                               f"{leaky.kind}, shape {leaky.shape}, the output ignores padding, but the weights it "
                               "returns give padded keys weight (recomputed without the mask?)",
                               {"conventions_working": 0})
            return Outcome("FAIL", f"forward takes a mask ({taken}), but under none of the conventions tried (bool "
                           "True = padding or keep, 1/0 keep, additive 0/-inf, -1e4, -1e9; shapes (B, L), (B, 1, 1, L),"
                           " (B, L, L)) does a real token's output stay as its text alone gives",
                           {"conventions_working": 0})
        return Outcome("NOTE", "the layer takes no mask: it is right only where no key it sees is padding (texts "
                       "of one length in a batch); the classifier pads by the lengths")
    seen = probe.base
    B, L, _ = probe.x.shape
    # More padding, with other numbers in the padded places: a real token must see neither.
    x = probe.other.clone()
    x[:, :L][probe.real()] = probe.x[probe.real()]
    more = torch.nn.functional.pad(probe.padding, (0, MORE_PADDING), value=True)
    moved = changed(probe.call(x, more).out[:, :L][probe.real()], seen.out[probe.real()])
    figures, parts = {"output_moved": moved}, [f"a real token's output moves by {rounding(moved)} with "
                                               f"{MORE_PADDING} more padded tokens"]
    if seen.weights is not None:
        on_padding = float(seen.weights.masked_fill(~probe.padding[:, None, None, :], 0)[
            probe.real()[:, None].expand_as(seen.weights[..., 0])].max())
        figures["pad_weight"] = on_padding
        parts.insert(0, f"largest weight on a padded key {figure(on_padding)}")
    verdict = "FAIL" if figures.get("pad_weight", 0) > 0 or not moved < INVARIANCE else "PASS"
    if probe.causal and not probe.layer.takes_mask:
        parts.append("causal, so it needs no mask: padding at the end is after every real token")
    return Outcome(verdict, "; ".join(parts), figures)


def neighbours(probe: Probe) -> Outcome:
    seen, real = probe.base, probe.real()
    alone = []
    for text, length in zip(probe.x, real.sum(-1).tolist()):
        alone.append(probe.call(text[None, :length], torch.zeros(1, length, dtype=torch.bool)).out[0])
    moved = max(changed(a, s[r]) for a, s, r in zip(alone, seen.out, real))
    return Outcome("FAIL" if not moved < INVARIANCE else "PASS",
                   f"a text's output moves by {rounding(moved)} when run alone instead of with its batch",
                   {"output_moved": moved})


def eval_steady(probe: Probe) -> Outcome:
    """Two evaluation passes give one output; where the class's constructor takes a dropout rate, the class built
    again with DROPOUT_RATE (its weights copied) must give, in evaluation, two equal outputs and the output of the
    class as probed (built with dropout 0, the product's default): dropout that runs in evaluation is caught only
    where it has something to drop."""
    again = probe.call(probe.x, probe.padding).out
    moved = changed(again[probe.real()], probe.base.out[probe.real()])
    figures, evidence = {"output_moved": moved}, f"two evaluation passes differ by {rounding(moved)}"
    if not moved < STEADY:
        return Outcome("FAIL", evidence, figures)
    found = with_dropout(probe)
    if found is None:
        return Outcome("PASS", evidence, figures)
    built, first, second = found
    steady, same = changed(second, first), changed(first, probe.base.out[probe.real()])
    figures.update(dropout_passes_moved=steady, dropout_output_moved=same)
    evidence += f"; built with {built}: two evaluation passes differ by {rounding(steady)}"
    if not steady < STEADY:
        return Outcome("FAIL", f"{evidence}: its dropout runs in evaluation (a rate passed whatever the mode)",
                       figures, fix="pass the rate only in training: dropout_p=self.dropout if self.training else "
                       "0.0, F.dropout(..., training=self.training), or an nn.Dropout module")
    evidence += f", and differ from the class built with dropout 0 by {rounding(same)}"
    if not same < INVARIANCE:
        return Outcome("FAIL", f"{evidence}: its evaluation output depends on the dropout rate", figures,
                       fix="let dropout act only in training: no rescaling by the rate in evaluation")
    return Outcome("PASS", evidence, figures)


def permutation(probe: Probe) -> Outcome:
    """Permuting the tokens permutes the output (a position-free family; the causal family's counterpart and the
    families with positions: monitor/layer_family.py)."""
    B, L, _ = probe.x.shape
    plain = probe.call(probe.x).out
    order = torch.randperm(L, generator=probe.generator)
    while bool((order == torch.arange(L)).all()):
        order = torch.randperm(L, generator=probe.generator)
    moved = changed(probe.call(probe.x[:, order]).out, plain[:, order])
    return Outcome("FAIL" if not moved < INVARIANCE else "PASS",
                   f"the output of permuted tokens differs from the permuted output by {rounding(moved)}",
                   {"output_moved": moved})


def look_ahead(probe: Probe) -> Outcome:
    """Every real query sees itself (sees_itself), and a layer that is not causal blocks no triangle of later keys
    (the causal family's counterpart: monitor/layer_family.py)."""
    parts, figures, bad, calm = sees_itself(probe)
    parts.insert(0, "not causal (later tokens reach earlier outputs)")
    bad += [found for found in (triangle_off(calm, probe.padding), unapplied_mask(probe)) if found]
    return Outcome("FAIL" if bad else "PASS", "; ".join(bad or parts), figures)


def sees_itself(probe: Probe):
    """Every real query sees itself: a mask that blocks the diagonal, or a first row with no key (NaN), is a finding.
    Returns (parts of the evidence, figures, findings, the weights of the input scaled down, or None)."""
    seen, real = probe.base, probe.real()
    parts, figures, bad = [], {}, []
    if not torch.isfinite(seen.out[real]).all():
        bad.append("a real token's output is NaN or inf (a row with no key left: -inf everywhere before softmax)")
    # The input scaled down, so that scores are near 0 and only a mask can leave a token no weight (a saturated
    # softmax gives exact zeros too).
    calm = probe.call(probe.x * CALM, probe.padding).weights
    if calm is not None:
        own = calm.diagonal(dim1=-2, dim2=-1)  # (B, H, L): each query's weight on its own token
        lowest = float(own.transpose(1, 2)[real].min())
        figures["own_weight"] = lowest
        parts.append(f"lowest weight of a real query on its own token {figure(lowest)}")
        if not lowest > 0:
            bad.append(f"a real query gives its own token weight {figure(lowest)}: the mask blocks the diagonal")
    return parts, figures, bad, calm


def triangle_off(weights: torch.Tensor | None, padding: torch.Tensor) -> str:
    """A non-causal layer whose zero weights between real tokens depend only on the key's offset from the query
    and form a triangle on one side: the later keys past k blocked and the next k seen (a look-ahead mask off by
    k), or every earlier key blocked and the later ones seen (the triangle reversed). A window that blocks far keys
    on both sides is not a triangle and stays a PASS."""
    if weights is None:
        return ""
    B, L = padding.shape
    offsets = torch.arange(L)[None, :] - torch.arange(L)[:, None]  # (L, L): key position − query position
    zero = weights == 0  # (B, H, L, L)
    blocked, seen = set(), set()
    for b in range(B):
        n = int((~padding[b]).sum())
        for offset in range(-(n - 1), n):
            cells = zero[b, :, :n, :n][:, offsets[:n, :n] == offset]
            if bool(cells.all()):
                blocked.add(offset)
            elif bool((~cells).all()):
                seen.add(offset)
            else:
                return ""  # zeros that do not follow the offset: not a mask by distance
    if blocked & seen or not blocked:
        return ""
    if all(d > 0 for d in blocked) and {d for d in seen if d > 0}:
        k = min(blocked) - 1
        if all(d in blocked for d in seen | blocked if d > k):
            return (f"the weights block the later keys from {k + 1} ahead but let the next {k} through: a look-ahead "
                    f"mask off by {k} (torch.tril(..., diagonal={k}) or triu(..., diagonal={k + 1}); the look-ahead "
                    "mask blocks every later key: tril(ones(L, L)) keeps, triu(ones(L, L), diagonal=1) blocks)")
    if all(d <= 0 for d in blocked) and all(d in blocked for d in seen | blocked if d < 0) and \
            {d for d in seen if d > 0}:
        return ("the weights block every earlier key and let the later ones through: the look-ahead triangle "
                "reversed (tril where triu was meant, or the mask's True read as keep)")
    return ""


def unapplied_mask(probe: Probe) -> str:
    """A class that keeps a look-ahead mask (a square triangular buffer) while later tokens reach earlier
    outputs: the mask is built and not applied (a masked_fill whose result is dropped, a float mask added
    instead of blocking). A class with a causal switch turned off is left alone."""
    switches = [value for name, value in vars(probe.user).items() if "causal" in name.lower()]
    if any(value is False for value in switches):
        return ""
    for name, buffer in probe.user.named_buffers():
        square = buffer.detach()
        while square.dim() > 2 and square.shape[0] == 1:
            square = square[0]
        if square.dim() != 2 or square.shape[0] != square.shape[1] or square.shape[0] < 2:
            continue
        nonzero = square != 0
        lower, upper = torch.tril(torch.ones_like(nonzero)), torch.triu(torch.ones_like(nonzero), diagonal=1)
        if bool((nonzero == lower).all()) or bool((nonzero == upper).all()):
            return (f"the class keeps a look-ahead mask (buffer {name!r}, {tuple(buffer.shape)}, triangular) but later "
                    "tokens reach earlier outputs: the mask is not applied (a masked_fill whose result is not kept, "
                    "or a float mask added where a bool mask blocks)")
    return ""


def train_eval(probe: Probe) -> Outcome:
    """In training mode with every dropout off the layer must compute what it computes in evaluation."""
    dropouts = [m for m in probe.layer.modules() if isinstance(getattr(m, "p", None), float) and "ropout" in
                type(m).__name__]
    rates = [m.p for m in dropouts]
    try:
        for m in dropouts:
            m.p = 0.0
        trained = probe.call(probe.x, probe.padding, train=True).out
    finally:
        for m, p in zip(dropouts, rates):
            m.p = p
    moved = changed(trained[probe.real()], probe.base.out[probe.real()])
    return Outcome("FAIL" if not moved < INVARIANCE else "PASS", f"training mode with its {len(dropouts)} dropout "
                   f"module(s) off differs from evaluation by {rounding(moved)}", {"output_moved": moved})


def stability(probe: Probe) -> Outcome:
    """Scores driven to about ±STABLE_SCORES by scaling the input: the output must stay finite."""
    layouts = probe.projections
    factor = 8.0
    if layouts:
        from model.attention import split_heads
        from monitor.layer_formula import project

        seen = probe.base
        q, k = (split_heads(project(seen.x.double(), p), layouts[0].heads) for p in (layouts[0].q, layouts[0].k))
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        largest = float(scores.max()) if float(scores.max()) > 0 else float(scores.abs().max())
        factor = math.sqrt(STABLE_SCORES / max(largest, 1e-6))  # the largest score grows with the input's square
    out = probe.call(probe.x * factor, probe.padding)
    finite = bool(torch.isfinite(out.out[probe.real()]).all()) and (
        out.weights is None or bool(torch.isfinite(out.weights[probe.real()[:, None].expand_as(
            out.weights[..., 0])]).all()))
    evidence = f"the input × {factor:.3g} (the largest score about {STABLE_SCORES:g})"
    if finite:
        return Outcome("PASS", f"{evidence}: output and weights finite", {"input_factor": factor})
    return Outcome("FAIL", f"{evidence}: the output holds NaN or inf: an unguarded exp() overflows (exp(89) is "
                   "inf in float32)", {"input_factor": factor})


def mask_name(probe: Probe) -> Outcome:
    """The convention the class's mask argument works in, against the one its name promises in PyTorch and Hugging
    Face (key_padding_mask True = padding, attention_mask 1 = keep), or, for a plain `mask`, the one of the family
    whose signature the class has: forward(query, key, value, mask) is the Annotated Transformer's and
    attention-is-all-you-need-pytorch's, whose callers build mask = (tokens != pad), 1 = keep."""
    convention = probe.layer.mask_convention
    if convention is None or convention.call in ("none", "positional"):
        return Outcome("PASS", "no mask argument whose name promises a convention")
    keeps = convention.kind.startswith(("bool True = keep", "1/0 keep"))
    pads = convention.kind == "bool True = padding"
    name = convention.call
    if name in PADDING_NAMES and keeps or name in KEEP_NAMES and pads:
        promised = "True = padding (PyTorch's)" if name in PADDING_NAMES else "1 = a token to attend to (Hugging Face's)"
        return Outcome("FAIL", f"your class inverts PyTorch's convention for this argument: {name} works as "
                       f"{convention.kind}, while {name} means {promised}: every caller that follows the name gets "
                       "the padding attended and the tokens hidden")
    if name == "mask" and inputs_taken(probe.user) == 3:
        if pads:
            return Outcome("FAIL", "your class inverts the convention of its family for this argument: forward(query, "
                           "key, value, mask) works with mask as bool True = padding, while the classes that write "
                           "this signature (the Annotated Transformer, attention-is-all-you-need-pytorch) read mask "
                           "as 1 = a token to attend to (their callers pass (tokens != pad)): such a caller gets the "
                           "padding attended and the tokens hidden", fix=FAMILY_MASK_FIX)
        return Outcome("PASS", f"mask works as {convention.kind}, as forward(query, key, value, mask)'s family "
                       "reads it (1 = a token to attend to)" if keeps else
                       f"mask works as {convention.kind}, a convention of its own (not True = padding)")
    return Outcome("PASS", f"{name} works as {convention.kind}, as its name promises")


FAMILY_MASK_FIX = ("read mask as 1 = keep: scores.masked_fill(mask == 0, -1e9), without inverting it first; or, if "
                   "True is meant to mark padding, name the argument key_padding_mask")
