"""The attention contract on one layer alone, no checkpoint, no data: what `diagnose.py --attention FILE.py:Class`
prints and `assert_attention_contract(MyAttention(64, 4))` raises with. Each check is one unit (monitor/layer_probe.py
`Check`), listed once in CHECKS and run by `layer_contract` on a seeded probe batch:

    shapes        the output is (B, L, D) (the user's own (B, L, ·)), weights (B, L, L) or (B, H, L, L), all finite
    softmax-rows  the weights of a real query are non-negative and sum to 1 over the keys
    padding       padded keys get exactly 0, and a text's output does not move with more padding
    neighbours    a text's output does not move with the other texts of its batch
    eval-steady   two passes in evaluation give the same output (dropout left on in eval FAILs here)
    permutation   permuting the tokens permutes the output (no positions inside attention)
    formula       softmax(Q Kᵀ/√d_k) V (W_O) recomputed from the layer's own weights, stage by stage
                  (monitor/layer_formula.py), the first stage that differs named with how
    scale         the spread of a freshly built layer's scores against what 1/√d_k gives
    gradcheck     float64 torch.autograd.gradcheck of the output on a tiny input
    gradient      every parameter gets gradient from a loss on the output
"""

import copy
import math
from types import SimpleNamespace

import torch
from torch import nn
from torch.autograd.gradcheck import GradcheckError

from model.attention import MultiHeadSelfAttention
from model.errors import ConfigError
from model.mask_probe import NoConvention, mask_calls
from monitor.contract import MATCH, compare
from monitor.doctor import Finding, Verdict
from monitor.layer_formula import SCALE_FACTOR, compare_layer, score_factor
from monitor.layer_probe import (MORE_PADDING, Check, Outcome, Probe, Row, Unusable, changed, figure, model_width,
                                 rounding)
from monitor.units import Check as Unit, Subject, examine, register

INVARIANCE = 1e-4  # relative change of a real token's output: float32 rounding gives ≤ 1e-6
STEADY = 1e-6  # relative change between two identical evaluation passes: exactly 0 for a deterministic layer
ROW_SUM = 1e-4  # |row sum − 1| of a real query's weights: float32 rounding gives ≤ 1e-6
GRADCHECK_STEP, GRADCHECK_RTOL = 1e-6, 1e-3  # torch.autograd.gradcheck's defaults
COARSE_STEP, COARSE_RTOL = 1e-3, 1e-2  # a step float32 resolves: its rounding costs ~1e-7/1e-3 = 1e-4 relative, the
# step's own error ~1e-6; a wrong backward misses by O(1)
NO_WEIGHTS = Outcome("NOTE", "the layer hands out no weights (return (output, weights) to get heatmaps and this check)")


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
    again = probe.call(probe.x, probe.padding).out
    moved = changed(again[probe.real()], probe.base.out[probe.real()])
    return Outcome("FAIL" if not moved < STEADY else "PASS",
                   f"two evaluation passes differ by {rounding(moved)}", {"output_moved": moved})


def permutation(probe: Probe) -> Outcome:
    if probe.builtin and not type(probe.layer).order_blind(SimpleNamespace(causal=probe.layer.causal)):
        return Outcome("NOTE", "this kind's keys depend on where the tokens are (a window or a look-ahead): order "
                       "matters by its definition")
    B, L, _ = probe.x.shape
    order = torch.randperm(L, generator=probe.generator)
    while bool((order == torch.arange(L)).all()):
        order = torch.randperm(L, generator=probe.generator)
    plain = probe.call(probe.x).out
    moved = changed(probe.call(probe.x[:, order]).out, plain[:, order])
    return Outcome("FAIL" if not moved < INVARIANCE else "PASS",
                   f"the output of permuted tokens differs from the permuted output by {rounding(moved)}",
                   {"output_moved": moved})


STAGE_FIXES = {
    "scores": "compute scores = Q Kᵀ / √d_k with Q = X W_Q, K = X W_K, the keys' last two axes transposed "
              "(K.transpose(-2, -1))",
    "mask": "block the padded keys, and only those: scores.masked_fill(key_padding_mask[:, None, None, :], "
            "float('-inf')) before softmax; no look-ahead mask in a classifier",
    "weights": "weights = scores.softmax(dim=-1) (over the keys), used as softmax made them",
    "output before W_O": "out = weights @ V with V = X W_V; merge the heads back with out.transpose(1, 2)"
                         ".reshape(B, L, H·d)",
    "output": "return W_O applied once to the merged heads' output",
}


def formula(probe: Probe) -> Outcome:
    if probe.builtin:
        return builtin_formula(probe)
    layouts = probe.projections
    if not layouts:
        return Outcome("NOTE", "the formula could not be checked: no W_Q, W_K, W_V found by name (W_Q, w_q, q_proj, "
                       "query, to_q, a fused qkv, nn.MultiheadAttention)",
                       fix="name them: diagnose.py --attention … --map q=ATTR,k=ATTR,v=ATTR,o=ATTR (or qkv=ATTR)")
    seen = probe.base
    if seen.raw_out is None:
        return Outcome("NOTE", "the formula could not be checked: the user's module returned no tensor")
    seen = SimpleNamespace(x=seen.x, out=seen.raw_out, weights=seen.raw_weights, heads=seen.heads)
    padding = probe.padding
    results = [compare_layer(layout, seen, padding) for layout in layouts]
    result = next((r for r in results if r.stage is None), results[0])
    probe.cache["matched"] = result.projections
    found = f"{result.projections.describe()}, {result.projections.heads} head(s)"
    figures = {"difference": result.largest if result.stage is None else result.difference}
    if result.stage is None and "output" not in result.stages:
        compared = f"{', '.join(result.stages)} match" if result.stages else "no stage could be compared"
        return Outcome("NOTE", f"{compared}; the output is not compared: no W_O found by name, and "
                       f"{', '.join(result.projections.others)} may be one ({found})", figures,
                       fix="name it: diagnose.py --attention … --map q=ATTR,k=ATTR,v=ATTR,o=ATTR")
    if result.stage is None:
        return Outcome("PASS", f"{', '.join(result.stages)} match the formula recomputed from {found} "
                       f"(largest difference {rounding(result.largest)})", figures)
    return Outcome("FAIL", f"{result.stage} differs by {figure(result.difference)}: {result.how} ({found})", figures,
                   fix=STAGE_FIXES.get(result.stage))


def builtin_formula(probe: Probe) -> Outcome:
    """A built-in kind against its own definition (its `reference`), by the doctor's comparison."""
    layer, real = probe.layer, probe.real()
    record = {}
    hook = layer.w_o.register_forward_pre_hook(lambda module, args: record.update(heads=args[0]))
    was_training = layer.training
    try:
        with torch.no_grad():
            out, handed = layer.eval().forward_packed(probe.x[real], probe.padding, True)
    finally:
        hook.remove()
        layer.train(was_training)
    record.update(x=probe.x[real], padding=probe.padding, out=out, attention=handed)
    with torch.no_grad():
        result = compare(layer, record, probe.padding, SimpleNamespace(scale=layer.scale, causal=layer.causal))
    if result["stage"] is None:
        return Outcome("PASS", f"every stage matches its kind's definition (largest difference "
                       f"{rounding(result['largest'])})", {"difference": result["largest"]})
    return Outcome("FAIL", f"{result['stage']} differs by {figure(result['difference'])}: {result['how']}",
                   {"difference": result["difference"]}, fix=STAGE_FIXES.get(result["stage"]))


def scale(probe: Probe) -> Outcome:
    if probe.builtin:
        factor, how = probe.layer.scale * math.sqrt(probe.layer.d_head), "the layer's scale setting"
    else:
        if not probe.projections:
            return Outcome("NOTE", "the scale could not be judged: the projections were not found (see formula)")
        if "matched" not in probe.cache:
            formula(probe)
        seen = probe.base
        seen = SimpleNamespace(x=seen.x, out=seen.raw_out, weights=seen.raw_weights, heads=seen.heads)
        factor, how = score_factor(probe.cache["matched"], seen, probe.padding)
        if math.isnan(factor):
            return Outcome("NOTE", "the scale could not be read: the layer's scores are not a multiple of the "
                           "formula's (see formula)")
    # ≥ 4 or ≤ 1/4 as the doctor's formula-setting, up to rounding ("divided by d_k", heads of 16: 0.2500001)
    far = factor * (1 + MATCH) >= SCALE_FACTOR or factor <= (1 + MATCH) / SCALE_FACTOR
    return Outcome("FAIL" if far else "PASS", f"the scores spread {figure(factor)} × what 1/√d_k gives ({how})",
                   {"scale_factor": factor})


def gradcheck(probe: Probe) -> Outcome:
    """torch.autograd.gradcheck in float64. A layer that computes in float32 inside (softmax(..., dtype=float32),
    as transformers writes it) makes float64 finite differences noise: its gradient is then compared with finite
    differences at a step float32 resolves (a NOTE when they agree), rather than failed."""
    layer = copy.deepcopy(probe.layer).double().eval()
    x = torch.randn(2, 3, probe.d_model, dtype=torch.float64, generator=probe.generator)

    def f(x):
        return layer(x, key_padding_mask=None, need_weights=False)[0]

    try:
        fine = directional_error(f, x, GRADCHECK_STEP, probe.generator)
        if fine < GRADCHECK_RTOL:  # torch's own check, which passes quickly where this one does
            torch.autograd.gradcheck(f, (x.requires_grad_(),), eps=GRADCHECK_STEP, atol=1e-5, rtol=GRADCHECK_RTOL,
                                     fast_mode=True)
            return Outcome("PASS", "analytical and numerical gradients agree (float64, 2 texts of 3 tokens)",
                           {"gradient_error": fine})
        coarse = directional_error(f, x, COARSE_STEP, probe.generator)
    except GradcheckError as e:
        return Outcome("FAIL", "the gradient the layer's backward gives differs from finite differences: "
                       + str(e).splitlines()[0])
    except Exception as e:  # a layer that cannot run in float64 is not judged here
        return Outcome("NOTE", f"not run: the layer raised {type(e).__name__} in float64: {e}".splitlines()[0])
    figures = {"gradient_error": fine, "coarse_gradient_error": coarse}
    if coarse < COARSE_RTOL:
        return Outcome("NOTE", f"float64 finite differences disagree by {figure(fine)} (relative), at step "
                       f"{COARSE_STEP:g} they agree within {figure(coarse)}: the layer computes in lower precision "
                       "inside", figures)
    return Outcome("FAIL", f"uᵀ J v from the layer's backward differs from finite differences by {figure(coarse)} "
                   f"(relative) at step {COARSE_STEP:g}, by {figure(fine)} at {GRADCHECK_STEP:g}", figures)


def directional_error(f, x: torch.Tensor, step: float, generator, directions: int = 3) -> float:
    """The largest relative gap between uᵀ J v from backward and from central differences of f at x, over a few
    random directions u (outputs) and v (inputs): what gradcheck's fast mode compares."""
    worst = 0.0
    for _ in range(directions):
        v = torch.randn(x.shape, dtype=x.dtype, generator=generator)
        point = x.detach().clone().requires_grad_()
        out = f(point)
        u = torch.randn(out.shape, dtype=out.dtype, generator=generator)
        (grad,) = torch.autograd.grad((out * u).sum(), point, allow_unused=True)
        analytical = float((grad * v).sum()) if grad is not None else 0.0
        with torch.no_grad():
            numerical = float(((f(x + step * v) - f(x - step * v)) * u).sum() / (2 * step))
        worst = max(worst, abs(analytical - numerical) / max(abs(numerical), abs(analytical), 1e-12))
    return worst


def gradient(probe: Probe) -> Outcome:
    layer = probe.layer
    key_bias = probe.projections[0].key_bias if probe.projections else None
    listed = [name for name, value in vars(probe.user).items()
              if not name.startswith("_") and isinstance(value, (list, tuple, dict))
              and any(isinstance(v, nn.Module) for v in (value.values() if isinstance(value, dict) else value))]
    count = sum(1 for _ in layer.parameters())
    if not any(p.requires_grad for p in layer.parameters()):  # no loss can reach anything: nothing to call backward on
        frozen = [name for name, _ in layer.named_parameters()]
        return Outcome("FAIL", f"nothing to train: requires_grad off: {', '.join(frozen)}" if frozen else
                       "nothing to train: the layer has no parameter (attention with no W_Q, W_K, W_V learns nothing)",
                       {"without_gradient": count})
    before = {name: p.grad for name, p in layer.named_parameters()}
    for p in layer.parameters():
        p.grad = None
    try:
        out = probe.call(probe.x, probe.padding, train=True, grad=True).out
        torch.manual_seed(probe.seed)
        (out[probe.real()] * torch.randn_like(out[probe.real()])).sum().backward()
        frozen, none, zero = [], [], []
        for name, p in layer.named_parameters():
            if not p.requires_grad:
                frozen.append(name)
            elif p.grad is None:
                none.append(name)
            elif not p.grad.any() and p is not key_bias:  # K's bias adds a constant to a row of scores: no gradient
                zero.append(name)
    finally:
        for name, p in layer.named_parameters():
            p.grad = before.get(name)
    parts = [f"{what}: {', '.join(names)}" for what, names in (
        ("no gradient", none), ("zero gradient", zero), ("requires_grad off", frozen),
        ("modules kept in a plain Python container, unseen by the optimizer", listed)) if names]
    return Outcome("FAIL" if parts else "PASS", "; ".join(parts) or f"all {count} parameters get gradient",
                   {"without_gradient": len(none) + len(zero) + len(frozen)})


CHECKS: list[Check] = [
    Check("shapes", shapes, "the output and weights of the probe batch",
          "the output is not (B, L, D) (the user's own not (B, L, ·)), the weights not (B, L, L) or (B, H, L, L), "
          "or the layer raised or gave NaN", "the heads merged wrongly, a transpose left in, a forward signature "
          "the product cannot call", "return out (B, L, ·) and weights (B, L, L) or (B, H, L, L); forward(x) or "
          "forward(x, mask)"),
    Check("softmax-rows", softmax_rows, "the weights of each real query",
          f"a weight < 0, or a row sum off 1 by ≥ {ROW_SUM:g}", "softmax over the wrong axis (the queries), weights "
          "rescaled after softmax, or no softmax", "weights = scores.softmax(dim=-1)"),
    Check("padding", padding, "the weights on padded keys; the output with more padding",
          f"a real query gives a padded key any weight, or its output moves by ≥ {INVARIANCE:g} (relative) with "
          "more padding", "the mask not applied, inverted (True = keep read as True = pad), or broadcast along the "
          "queries", "fill the padded keys' scores with -inf before softmax, mask shape (B, 1, 1, L)"),
    Check("neighbours", neighbours, "each text alone against the batch",
          f"a text's output moves by ≥ {INVARIANCE:g} (relative)",
          "something mixes the texts of a batch (a mean or softmax over the batch axis, a mask of the wrong text)",
          "keep every operation within one text: the batch axis is never reduced"),
    Check("eval-steady", eval_steady, "two evaluation passes", f"they differ by ≥ {STEADY:g} (relative)",
          "dropout applied whatever the mode (F.dropout(..., training=True), torch.bernoulli), or other randomness",
          "use nn.Dropout (or F.dropout(..., training=self.training))"),
    Check("permutation", permutation, "the output of permuted tokens",
          f"it differs from the permuted output by ≥ {INVARIANCE:g} (relative)",
          "positions inside attention (a position embedding or bias in the layer), a look-ahead mask, or tokens "
          "mixed by position", "leave positions to the classifier's embedding; no triangular mask in an encoder"),
    Check("formula", formula, "the layer's own W_Q, W_K, W_V (W_O) and its stages",
          "a stage (mask, scores up to a row's constant, weights, output before W_O, output) differs from "
          "softmax(Q Kᵀ/√d_k) V (W_O) recomputed from the layer's weights in float64 by ≥ 1e-3",
          "the code departs from the formula at the named stage", "read the line that makes the named stage"),
    Check("scale", scale, "the spread of the scores of the freshly built layer",
          f"≥ {SCALE_FACTOR:g}× or ≤ 1/{SCALE_FACTOR:g} of what 1/√d_k gives",
          "no scaling (saturated softmax) or a scale far too small such as 1/d_k (over-uniform attention)",
          "divide the scores by math.sqrt(d_k), d_k the size of one head"),
    Check("gradcheck", gradcheck, "the output's gradient in float64 against finite differences",
          "torch.autograd.gradcheck fails", "a hand-written backward (autograd.Function) that is wrong, or an "
          "in-place change autograd cannot follow", "let autograd differentiate the forward"),
    Check("gradient", gradient, "every parameter's gradient from a loss on the output",
          "a parameter gets no (or exactly zero) gradient, is frozen, or modules sit in a plain list",
          "a stray .detach(), a projection never used, requires_grad off, modules in a Python list",
          "follow the parameter from the output back: no .detach(), nn.ModuleList for lists"),
]


def learning(probe: Probe) -> Outcome:
    """The class in the classifier on the synthetic task against the built-in full layer (training/learning.py)."""
    if not isinstance(probe.spec, str):
        return Outcome("NOTE", "not run: give the class as file.py:ClassName (or package.module:ClassName) to train it")
    from training.learning import EPOCHS, MARGIN, learns

    found = learns(probe.spec, probe.args)
    figures = {"accuracy": found["accuracy"], "built_in_accuracy": found["built_in"]}
    shape = found["shape"]
    same = f" of the same shape ({shape['n_heads']} head(s) of {shape['d_head']})" if shape else ""
    evidence = (f"validation accuracy {found['accuracy']:.3f} on the synthetic task after {EPOCHS} epochs, the "
                f"built-in full layer{same} {found['built_in']:.3f} (learns: within {MARGIN:g} of it)")
    if found["learns"]:
        return Outcome("PASS", evidence, figures)
    failed = [row.check for row in probe.cache.get("rows", []) if row.verdict == "FAIL"]
    cause = (f"the contract's FAILs above: {', '.join(failed)}" if failed else "the contract finds no mistake: the "
             "layer computes attention but learns slower here (its initialisation, an output width the product "
             "projects back, a head too small)")
    return Outcome("FAIL", "not-learning: " + evidence, figures, cause=cause,
                   fix="fix the FAILed checks first" if failed else "compare its initialisation and sizes with "
                   "model/attention.py's MultiHeadSelfAttention")


LEARN = Check("learn", learning, "the class trained in the classifier (configs/smoke.yaml's synthetic task), and "
              "the built-in full layer trained alike", "its validation accuracy falls short of the built-in layer's "
              "by more than a margin after the same epochs (not-learning)", "", "")


def long_input_row(layer: nn.Module, d_model: int, length: int) -> Row:
    """The long-input check: the layer on a text of the run's max_length tokens (the other checks read 7)."""
    from model.user_class import long_input_problem

    problem = long_input_problem(layer, d_model, length)
    return Row("long-input", "FAIL" if problem else "PASS", problem or f"a text of {length} tokens: finite output",
               {}, LONG_INPUT.reads, LONG_INPUT.rule, LONG_INPUT.cause, LONG_INPUT.fix)


LONG_INPUT = Check("long-input", None, "the output of a text of max_length tokens (--max-length; the other checks "
                   "read 7)", "the layer raises or gives NaN or infinity on it", "something that grows with the "
                   "length past what fits (an allocation, a fixed-size table or mask, a sum that overflows)",
                   "run the class on a text of max_length tokens and follow the first line of the error")


def build(layer_or_class, *, d_model: int, n_heads: int, d_head: int | None, args: dict | None) -> nn.Module:
    """The layer to probe: a built-in kind or the adapter as it is; a built-in kind's class built; a user's class
    or "file.py:Class" built as the classifier builds it (model/own_attention.py), or a user's module instance,
    in the adapter. A class that cannot be loaded or built is a ConfigError line (bad input); one whose forward
    the adapter cannot call is Unusable (the shapes check FAILs with why)."""
    from model.own_attention import OwnAttention, build_user_layer, load_attention_class

    if isinstance(layer_or_class, type) and issubclass(layer_or_class, MultiHeadSelfAttention):
        return layer_or_class(d_model=d_model, n_heads=n_heads, d_head=d_head, **(args or {}))
    if isinstance(layer_or_class, (MultiHeadSelfAttention, OwnAttention)):
        return layer_or_class
    if isinstance(layer_or_class, nn.Module):
        user, d_model = layer_or_class, model_width(layer_or_class)
    else:
        cls = load_attention_class(layer_or_class) if isinstance(layer_or_class, str) else layer_or_class
        user = build_user_layer(cls, d_model, n_heads, d_head or d_model // n_heads, args, args_flag="--args")
    try:
        return OwnAttention(built(user), d_model=d_model, n_heads=n_heads, d_head=d_head,
                            name=layer_or_class if isinstance(layer_or_class, str) else None)
    except NoConvention as e:  # it needs a mask and no convention keeps padding out: the padding check FAILs
        raise Unusable(str(e), "padding") from None
    except ConfigError as e:  # the adapter could not call its forward: the layer's fault, not the input's
        raise Unusable(str(e)) from None


def built(user: nn.Module):
    """A class-like factory that hands the adapter this module instead of building one (it takes no argument)."""
    def factory():
        return user

    factory.__name__ = factory.__qualname__ = type(user).__name__
    factory.__module__ = type(user).__module__
    return factory


def layer_contract(layer_or_class, *, d_model: int = 64, n_heads: int = 4, d_head: int | None = None,
                   args: dict | None = None, mapping: dict | None = None, seed: int = 0,
                   learn: bool = False, max_length: int = 128) -> list[Row]:
    """Every check of CHECKS on one layer: a built layer (a built-in kind, the adapter, or a user's module), a
    class, or "file.py:ClassName". mapping: {"q"|"k"|"v"|"o"|"qkv": attribute path} where the projections'
    names are not found. learn: add the last check, the class trained on the synthetic task (seconds to minutes).
    max_length: the longest text the layer will read, the length of the long-input check (long_input_row)."""
    torch.manual_seed(seed)
    try:
        layer = build(layer_or_class, d_model=d_model, n_heads=n_heads, d_head=d_head, args=args)
    except Unusable as e:
        failed = e.args[1] if len(e.args) > 1 else "shapes"  # the check the reason belongs to
        return [Row(check.name, "FAIL" if check.name == failed else "NOTE", e.args[0] if check.name == failed
                    else f"not run: the layer could not be called (see {failed})", {}, check.reads, check.rule,
                    check.cause, check.fix) for check in CHECKS]
    probe = Probe(layer, mapping=mapping, seed=seed, spec=layer_or_class, args=args)
    figures, _ = examine(Subject(layer=probe))  # the doctor's one runner: every registered check that reads a layer
    rows = probe.cache["rows"] = [measured["row"] for measured in figures.values() if "row" in measured]
    if probe.user is not layer:  # a user's class in the adapter: built-in kinds read what their settings define
        rows.append(long_input_row(layer, probe.d_model, max_length))
    return rows + [LEARN(probe)] if learn else rows


def registered(check: Check) -> Unit:
    """A layer check as a unit of the doctor's registry (monitor/units.py): it reads the subject's layer (a Probe:
    the layer and its seeded inputs); a FAIL is its warning, a NOTE the shared layer note."""
    verdict = f"attention-{check.name}"

    def run(subject: Subject, measured: dict):
        row = check(subject.layer)
        found = {"FAIL": [Finding(verdict, None, None, row.figures, row.evidence)],
                 "NOTE": [Finding(NOTE, None, None, row.figures, f"{check.name}: {row.evidence}")]}
        return {"row": row, **row.figures}, found.get(row.verdict, [])

    return register(Unit(verdict, ("layer",), run, {verdict: Verdict("warning", row_rule(check), check.cause,
                                                                     check.fix), NOTE: LAYER_NOTE},
                         summary=f"diagnose.py --attention: {check.reads}"))


def row_rule(check: Check) -> str:
    return f"{check.name} FAILs when {check.rule}"


NOTE = "attention-note"
LAYER_NOTE = Verdict("note", "a layer check could not judge fully (no mask taken, projections not found by name, "
                     "computed in lower precision inside)", "the class leaves out what the check reads: it takes no "
                     "mask, names its projections otherwise, or computes in lower precision inside",
                     "name the projections with --map q=…,k=…,v=…,o=…; give forward a mask argument; or nothing, "
                     "where the NOTE says the layer is right as it is used")
for _check in CHECKS:
    registered(_check)


def table(rows: list[Row]) -> str:
    """The rows as the command prints them: check, verdict, evidence; cause and fix under each FAIL and NOTE."""
    width = max(len(row.check) for row in rows)
    lines = []
    for row in rows:
        lines.append(f"{row.check:<{width}}  {row.verdict:<4}  {row.evidence}")
        if row.verdict == "FAIL":
            lines.append(f"{'':<{width}}        likely cause: {row.cause}; try: {row.fix}")
        elif row.verdict == "NOTE" and row.fix and "--map" in row.fix:
            lines.append(f"{'':<{width}}        try: {row.fix}")
    failed = [row.check for row in rows if row.verdict == "FAIL"]
    lines.append(f"{len(failed)} FAIL" + (f": {', '.join(failed)}" if failed else ""))
    return "\n".join(lines)


def assert_attention_contract(layer_or_class, **settings) -> list[Row]:
    """For a user's own tests: AssertionError with the table when a check FAILs; the rows otherwise.

        assert_attention_contract(MyAttention(64, 4))
    """
    rows = layer_contract(layer_or_class, **settings)
    if any(row.verdict == "FAIL" for row in rows):
        raise AssertionError("the attention contract fails:\n" + table(rows))
    return rows
