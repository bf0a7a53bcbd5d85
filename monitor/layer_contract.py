"""The attention contract on one layer alone, no checkpoint, no data: what `diagnose.py --attention FILE.py:Class`
prints and `assert_attention_contract(MyAttention(64, 4))` raises with. Each check is one unit, the doctor's `Check`
(monitor/units.py, made by monitor/layer_probe.py's layer_check with its verdicts), listed once in CHECKS, registered
with the doctor and run by its runner on a seeded probe batch:

    shapes        the output is (B, L, D) (the user's own (B, L, ·)), weights (B, L, L) or (B, H, L, L), all finite;
                  built with the network's head count it does not return H·L rows (heads stacked along the tokens)
    softmax-rows  the weights of a real query are non-negative and sum to 1 over the keys
    padding       padded keys get exactly 0, and a text's output does not move with more padding
    neighbours    a text's output does not move with the other texts of its batch
    eval-steady   two passes in evaluation give the same output, also with the class built with dropout 0.5 where
                  its constructor takes a rate (dropout left on in eval FAILs here)
    train-eval    training mode with the dropout modules off computes what evaluation computes
    permutation   permuting the tokens permutes the output (position-free families; causal: the last token's output
                  ignores the order of the tokens before it; a NOTE where the family has positions)
    look-ahead    every real query sees its own token; causal: no earlier output moves when later tokens change
    formula       softmax(Q Kᵀ/√d_k) V (W_O) recomputed from the layer's own weights on what its projections read,
                  stage by stage (monitor/layer_formula.py), with the family's look-ahead mask; for a family with
                  position terms, the output from the weights it used, the first stage that differs named with how;
                  post-norm: the output past W_O is its norm of x + W_O's output (the residual the family has)
    scale         the spread of a freshly built layer's scores against what 1/√d_k gives (scores that are an exact
                  multiple of Q Kᵀ/√d_k judged more finely)
    stability     the input scaled until the largest score is about 120: the output stays finite (an unguarded exp())
    mask-name     a mask argument named key_padding_mask / attention_mask works in the convention its name promises;
                  a plain `mask` of forward(query, key, value, mask) in its family's (1 = keep)
    gradcheck     float64 torch.autograd.gradcheck of the output on a tiny input
    gradient      every parameter gets gradient from a loss on the output

Before the verdicts, the layer's family (monitor/layer_family.py) as one identity line: mask, positions, where its
weights come from, normalisation inside.
"""

import math
from types import SimpleNamespace

import torch
from torch import nn

from model.errors import ConfigError
from model.kind import Kind
from model.own_attention import NoConvention, runs
from monitor.contract import compare
from monitor.layer_behaviour import (ROW_SUM, STEADY, eval_steady, look_ahead, mask_name, neighbours,
                                     padding, permutation, shapes, softmax_rows, stability, train_eval)
from monitor.layer_family import by_family, find_family, post_norm_residual
from monitor.layer_formula import compare_layer, score_factor
from monitor.layer_gradients import gradcheck, gradient
from monitor.layer_probe import (Outcome, Probe, Row, Unusable, answer, figure, judged, layer_check, model_width,
                                 rounding)
from monitor.layer_rebuilt import DROPOUT_RATE
from monitor.stage_compare import MATCH
from monitor.thresholds import INVARIANCE, SCALE_FACTOR
from monitor.units import Check, Subject, examine, register


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
    if probe.layer.reference_keys_values is not None:  # a kind with a definition (model/kind.py)
        return defined_formula(probe)
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
    results = [compare_layer(layout, seen, padding, probe.causal) for layout in layouts]
    result = next((r for r in results if r.stage is None), results[0])
    after = ""
    o_out = probe.base.o_out
    if result.stage == "output" and o_out is not None and o_out.shape[:2] == seen.out.shape[:2]:
        # What W_O gave may be right while the class adds more after it (a residual and LayerNorm, another
        # Linear): the formula ends at W_O.
        at_o = compare_layer(result.projections, SimpleNamespace(**{**vars(seen), "out": o_out}), padding,
                             probe.causal)
        if at_o.stage is None:
            probe.cache["at_o"] = True  # the scale check reads W_O's output too
            changed_by = ", ".join(result.projections.others) or "its code"
            after = f"; the class changes W_O's output after it ({changed_by}): not part of the formula"
            post_norm = find_family(probe).norm == "post-norm"
            residual, norm = post_norm_residual(probe, o_out, seen.out) if post_norm else ("", "")
            if residual == "missing":
                probe.cache["matched"] = result.projections
                return Outcome("FAIL", f"output differs from its post-norm family's {norm}(x + W_O out): it is "
                               f"{norm}(W_O out), the residual left out (the stages up to W_O match the formula "
                               f"recomputed from {result.projections.describe()})", {"difference": result.difference},
                               fix="add the input back before the norm: out = norm(x + dropout(W_O(heads))) (the "
                               "post-norm sublayer's residual, q += residual)")
            if residual == "residual":
                after = f"; after W_O it returns {norm}(x + W_O out), its post-norm family's output"
            result = at_o
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
                       f"(largest difference {rounding(result.largest)}){after}", figures)
    return Outcome("FAIL", f"{result.stage} differs by {figure(result.difference)}: {result.how} ({found})", figures,
                   fix=STAGE_FIXES.get(result.stage))


def defined_formula(probe: Probe) -> Outcome:
    """A kind against its own definition (its reference_keys_values), by the doctor's comparison."""
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
    exact = False
    if probe.layer.scale is not None:  # set by the kind's definition (model/kind.py)
        factor, how = probe.layer.scale * math.sqrt(probe.layer.d_head), "the layer's scale setting"
    else:
        if not probe.projections:
            return Outcome("NOTE", "the scale could not be judged: the projections were not found (see formula)")
        if "matched" not in probe.cache:
            formula(probe)
        seen = probe.base
        out = seen.o_out if probe.cache.get("at_o") else seen.raw_out
        seen = SimpleNamespace(x=seen.x, out=out, weights=seen.raw_weights, heads=seen.heads)
        factor, how, exact = score_factor(probe.cache["matched"], seen, probe.padding, probe.causal)
        if math.isnan(factor):
            return Outcome("NOTE", "the scale could not be read: the layer's scores are not a multiple of the "
                           "formula's (see formula)")
    # ≥ 4 or ≤ 1/4 as the doctor's formula-setting, up to rounding ("divided by d_k", heads of 16: 0.2500001)
    far = factor * (1 + MATCH) >= SCALE_FACTOR or factor <= (1 + MATCH) / SCALE_FACTOR
    # Scores that are exactly c × Q Kᵀ/√d_k are a scale mistake well inside 4× (√d_model for √d_k with 4 heads: ½×):
    # the correct classes measured give c = 1 to 1e-7, the scale mistakes of the held-out sets ½× or 2× and beyond.
    off = exact and not 1 / EXACT_SCALE < factor < EXACT_SCALE
    evidence = f"the scores spread {figure(factor)} × what 1/√d_k gives ({how})"
    if off and not far:
        evidence += f": exactly {figure(factor)} × Q Kᵀ/√d_k, a scale other than 1/√d_k, d_k the size of one head"
    return Outcome("FAIL" if far or off else "PASS", evidence, {"scale_factor": factor})


EXACT_SCALE = 1.1  # scores exactly this many times Q Kᵀ/√d_k, or 1/this, are a scale mistake (see scale)


def family_check(name: str, judge, reads: str, rule: str, cause: str, fix: str) -> Check:
    """A layer check (layer_check) judged by the layer's family where the family's contract names it, else by
    `judge`, which assumes the position-free, unmasked formula (monitor/layer_family.py FAMILIES)."""
    return layer_check(name, by_family(name, judge), reads, rule, cause, fix)


CHECKS: list[Check] = [  # each registered with the doctor below (monitor/units.py)
    family_check(
        "shapes", shapes, "the output and weights of the probe batch",
        "the output is not (B, L, D) (the user's own not (B, L, ·)), the weights not (B, L, L) or (B, H, L, L), "
        "the layer raised or gave NaN, or, built with the network's H heads, it returns H·L rows for L tokens",
        "the heads merged wrongly (concatenated along the tokens), a transpose left in, a forward signature the "
        "product cannot call", "return out (B, L, ·) and weights (B, L, L) or (B, H, L, L); forward(x) or "
        "forward(x, mask)"),
    family_check(
        "softmax-rows", softmax_rows, "the weights of each real query",
        f"a weight < 0, or a row sum off 1 by ≥ {ROW_SUM:g}", "softmax over the wrong axis (the queries), weights "
        "rescaled after softmax, or no softmax", "weights = scores.softmax(dim=-1)"),
    family_check(
        "padding", padding, "the weights on padded keys; the output with more padding",
        f"a real query gives a padded key any weight, or its output moves by ≥ {INVARIANCE:g} (relative) with "
        "more padding", "the mask not applied, inverted (True = keep read as True = pad), or broadcast along the "
        "queries", "fill the padded keys' scores with -inf before softmax, mask shape (B, 1, 1, L)"),
    family_check(
        "neighbours", neighbours, "each text alone against the batch",
        f"a text's output moves by ≥ {INVARIANCE:g} (relative)",
        "something mixes the texts of a batch (a mean or softmax over the batch axis, a mask of the wrong text)",
        "keep every operation within one text: the batch axis is never reduced"),
    family_check(
        "eval-steady", eval_steady, "two evaluation passes, of the class as built and built with dropout "
        f"{DROPOUT_RATE:g} where its constructor takes a rate", f"they differ by ≥ {STEADY:g} (relative), or the "
        f"class built with dropout differs from the one built without by ≥ {INVARIANCE:g}",
        "dropout applied whatever the mode (F.dropout(..., training=True), torch.bernoulli), or other randomness",
        "use nn.Dropout (or F.dropout(..., training=self.training))"),
    family_check(
        "train-eval", train_eval, "the output in training mode with every dropout module off",
        f"it differs from evaluation by ≥ {INVARIANCE:g} (relative)", "code that runs only in training or only in "
        "evaluation besides dropout (a mask applied `if self.training`, F.dropout(..., training=True))",
        "let dropout modules be the only difference between the modes"),
    family_check(
        "permutation", permutation, "the output of permuted tokens (causal: of the last token, the tokens before "
        "it permuted)", f"it differs from the permuted output by ≥ {INVARIANCE:g} (relative), in a family without "
        "position terms", "positions inside attention that are neither a content-free bias nor relative, tokens "
        "mixed by position (heads split or merged wrongly), a mask that depends on position",
        "leave positions to the classifier's embedding, or make them a bias on the scores; split heads with "
        "view(B, L, H, d).transpose(1, 2)"),
    family_check(
        "look-ahead", look_ahead, "each real query's weight on its own token; causal: earlier outputs with later "
        "tokens changed", f"a real query gives its own token no weight, an output is NaN, or (causal) an earlier "
        f"output moves by ≥ {INVARIANCE:g} when later tokens change", "a look-ahead mask that blocks the diagonal "
        "(torch.triu(ones, diagonal=0)) or the wrong triangle (True = keep given to a kernel that reads True = "
        "blocked, or the reverse)", "block the later keys only: torch.triu(torch.ones(L, L, dtype=torch.bool), "
        "diagonal=1) as the blocked set (masked_fill ... -inf), or its negation as SDPA's attn_mask (True = keep)"),
    family_check(
        "formula", formula, "the layer's own W_Q, W_K, W_V (W_O) and its stages",
        "a stage (mask, scores up to a row's constant, weights, output before W_O, output) differs from "
        "softmax(Q Kᵀ/√d_k) V (W_O) recomputed from the layer's weights in float64 by ≥ 1e-3; post-norm: the "
        "output is its norm of W_O's output alone, without the residual",
        "the code departs from the formula at the named stage", "read the line that makes the named stage"),
    family_check(
        "scale", scale, "the spread of the scores of the freshly built layer",
        f"≥ {SCALE_FACTOR:g}× or ≤ 1/{SCALE_FACTOR:g} of what 1/√d_k gives, or the scores exactly c × Q Kᵀ/√d_k "
        f"with c ≥ {EXACT_SCALE:g} or ≤ 1/{EXACT_SCALE:g}",
        "no scaling (saturated softmax) or a scale far too small such as 1/d_k (over-uniform attention)",
        "divide the scores by math.sqrt(d_k), d_k the size of one head"),
    family_check(
        "stability", stability, "the output with the input scaled until the largest score is about 120",
        "the output or weights hold NaN or inf", "a softmax written as exp(s) / exp(s).sum() without subtracting "
        "the row maximum: exp() overflows float32 past 88.7", "use scores.softmax(dim=-1), or subtract "
        "scores.amax(dim=-1, keepdim=True) before exp()"),
    family_check(
        "mask-name", mask_name, "the convention the mask argument works in against its name",
        "key_padding_mask / src_key_padding_mask works as True = keep, attention_mask as bool True = padding, or "
        "the mask of forward(query, key, value, mask) as bool True = padding",
        "the mask read the other way round from the convention its name has in PyTorch and Hugging Face, or its "
        "signature's family (the Annotated Transformer: 1 = keep)",
        "key_padding_mask: True marks padding (masked_fill(key_padding_mask, -inf)); attention_mask: 1 marks a "
        "token (masked_fill(attention_mask == 0, -inf))"),
    family_check(
        "gradcheck", gradcheck, "the output's gradient in float64 against finite differences",
        "torch.autograd.gradcheck fails", "a hand-written backward (autograd.Function) that is wrong, or an "
        "in-place change autograd cannot follow", "let autograd differentiate the forward"),
    family_check(
        "gradient", gradient, "every parameter's gradient from a loss on the output",
        "a parameter gets no (or exactly zero) gradient, is frozen, or modules sit in a plain list",
        "a stray .detach(), a projection never used, requires_grad off, modules in a Python list",
        "follow the parameter from the output back: no .detach(), nn.ModuleList for lists"),
]


def learning(probe: Probe) -> Outcome:
    """The class in the classifier on the synthetic task against the built-in full layer (monitor/learning.py)."""
    if not isinstance(probe.spec, str):
        return Outcome("NOTE", "not run: give the class as file.py:ClassName (or package.module:ClassName) to train it")
    from monitor.learning import EPOCHS, MARGIN, learns

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


LEARN = layer_check(
    "learn", learning, "the class trained in the classifier (configs/smoke.yaml's synthetic task), and the built-in "
    "full layer trained alike", "its validation accuracy falls short of the built-in layer's by more than a margin "
    "after the same epochs (not-learning)", "", "")


def long_input(probe: Probe) -> Outcome:
    """The layer on a text of the run's max_length tokens (the other checks read 7)."""
    problem = probe.layer.problem_at_length(probe.max_length)
    return Outcome("FAIL" if problem else "PASS", problem or f"a text of {probe.max_length} tokens: finite output")


LONG_INPUT = layer_check(
    "long-input", long_input, "the output of a text of max_length tokens (--max-length; the other checks read 7)",
    "the layer raises or gives NaN or infinity on it", "something that grows with the length past what fits (an "
    "allocation, a fixed-size table or mask, a sum that overflows)", "run the class on a text of max_length tokens "
    "and follow the first line of the error")


def build(layer_or_class, *, d_model: int, n_heads: int, d_head: int | None, args: dict | None) -> nn.Module:
    """The layer to probe: a layer of a kind (model/kind.py) as it is; a kind's class built; a user's class or
    "file.py:Class" built as the classifier builds it (model/own_attention/), or a user's module instance, in the
    adapter. A class that cannot be loaded or built is a ConfigError line (bad input); one whose forward the adapter
    cannot call is Unusable (the shapes check FAILs with why)."""
    from model.own_attention import OwnAttention, build_user_layer, load_attention_class

    if isinstance(layer_or_class, Kind):
        return layer_or_class
    if isinstance(layer_or_class, type) and issubclass(layer_or_class, Kind):
        return layer_or_class(d_model=d_model, n_heads=n_heads, d_head=d_head, **(args or {}))
    if isinstance(layer_or_class, nn.Module):
        user, d_model = layer_or_class, model_width(layer_or_class)
    else:
        cls = load_attention_class(layer_or_class) if isinstance(layer_or_class, str) else layer_or_class
        user = build_user_layer(cls, d_model, n_heads, d_head or d_model // n_heads, args, args_flag="--args",
                                runs=runs)
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
    max_length: the longest text the layer will read, the length of the long-input check (LONG_INPUT)."""
    torch.manual_seed(seed)
    try:
        layer = build(layer_or_class, d_model=d_model, n_heads=n_heads, d_head=d_head, args=args)
    except Unusable as e:
        failed = e.args[1] if len(e.args) > 1 else "shapes"  # the check the reason belongs to
        rows = Rows(answer(check, Outcome("FAIL", e.args[0]) if check.name == failed else Outcome(
            "NOTE", f"not run: the layer could not be called (see {failed})")) for check in CHECKS)
        rows.identity = f"identity: not found (the layer could not be called: see {failed})"
        return rows
    probe = Probe(layer, mapping=mapping, seed=seed, spec=layer_or_class, args=args, max_length=max_length)
    figures, _ = examine(Subject(layer=probe))  # the doctor's one runner: every registered check that reads a layer
    rows = probe.cache["rows"] = Rows(measured["row"] for measured in figures.values() if "row" in measured)
    if layer.reference_keys_values is None:  # no definition: what it does at max_length is found by running it
        rows.append(judged(LONG_INPUT, probe))
    try:
        rows.identity = find_family(probe).line()
    except Unusable:
        rows.identity = "identity: not found (the layer could not be called: see shapes)"
    if learn:
        rows.append(judged(LEARN, probe))
    return rows


class Rows(list):
    """The rows of layer_contract, with the layer's identity line (monitor/layer_family.py)."""

    identity = ""


for _check in CHECKS:
    register(_check)


def table(rows: list[Row]) -> str:
    """The rows as the command prints them: check, verdict, evidence; cause and fix under each FAIL and NOTE."""
    width = max(len(row.check) for row in rows)
    lines = [rows.identity] if getattr(rows, "identity", "") else []
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
