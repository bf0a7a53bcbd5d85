"""The user-attention catalogue (bench/catalogue/user_attention) is what it says: every class imports on its own, builds from
the names it declares and runs; the correct ones compute softmax(Q Kᵀ/√d_k) V (W_O) from their own projection
weights and keep every property below; each buggy one breaks every property its entry names.

The properties are the categories of bench/catalogue/user_attention/catalogue.py, checked here from behaviour and from each
class's own weights (found by the names the files use). How each class takes its mask is written in MASKS (its
header comment says the same); a product must find it by probing, so the manifest does not carry it.
Where a property cannot be checked for a class (weights it does not return, a mask it does not take) it is skipped
for that class; the tests require every category a buggy entry names to be checkable, and checked false.
"""

import ast
import importlib.util
import inspect
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.catalogue.user_attention.catalogue import CATALOGUE, CATEGORIES

FOLDER = Path(__file__).resolve().parents[1] / "bench" / "catalogue" / "user_attention"
D, HEADS, HEAD_SIZE = 32, 4, 8  # the model width, heads and head size every class is built with
WIDTH_NAMES = ("d_model", "embed_dim", "hidden_size", "dim")
HEAD_COUNT_NAMES = ("n_heads", "num_heads", "num_attention_heads", "heads")
HEAD_SIZE_NAMES = ("d_k", "d_head", "head_dim")
LENGTHS = (3, 5)  # text 0 has two padded tokens at the end, text 1 none: a (2, 5, 32) batch
B, L = len(LENGTHS), max(LENGTHS)

# file → (the forward argument that takes the mask, its convention): bool-pad True = padding, bool-keep True = token,
# keep-01 1 = token / 0 = padding (long), additive (B, 1, 1, L) of 0 / -10000, pair-keep (B, L, L) True = may see.
MASKS = {
    "numpy_style_softmax.py": ("mask", "keep-01"),
    "einsum_multihead.py": ("mask", "bool-keep"),
    "fused_qkv.py": ("mask", "bool-keep"),
    "mha_wrapper.py": ("key_padding_mask", "bool-pad"),
    "bert_self_attention.py": ("attention_mask", "additive"),
    "sdpa_with_weights.py": ("attn_mask", "bool-keep"),
    "key_padding_mask_attention.py": ("key_padding_mask", "bool-pad"),
    "hf_attention_mask.py": ("attention_mask", "keep-01"),
    "annotated_transformer.py": ("mask", "pair-keep"),
    "lucidrains_attention.py": ("mask", "bool-keep"),
    "bert_scale_by_head_size.py": ("attention_mask", "additive"),
    "lucidrains_scale_power.py": ("mask", "bool-keep"),
    "key_padding_mask_rows.py": ("key_padding_mask", "bool-pad"),
    "hf_mask_not_inverted.py": ("attention_mask", "keep-01"),
    "einsum_mask_unused.py": ("mask", "bool-keep"),
    "mask_after_softmax.py": ("mask", "bool-keep"),
    "annotated_fill_zero.py": ("mask", "pair-keep"),
    "split_heads_view.py": ("key_padding_mask", "bool-pad"),
    "bert_merge_heads_view.py": ("attention_mask", "additive"),
    "lucidrains_dropout_eval.py": ("mask", "bool-keep"),
    "sdpa_weights_unmasked.py": ("attn_mask", "bool-keep"),
    "scores_returned.py": ("key_padding_mask", "bool-pad"),
    "hf_transposed_product.py": ("attention_mask", "keep-01"),
    "annotated_masked_fill_discarded.py": ("mask", "bool-keep"),
}

CORRECT = [e for e in CATALOGUE if e["correct"]]
BUGGY = [e for e in CATALOGUE if not e["correct"]]


def entry_id(entry):
    return entry["file"].removesuffix(".py")


def load_class(entry):
    path = FOLDER / entry["file"]
    spec = importlib.util.spec_from_file_location(f"user_attention_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, entry["class_name"])


def build(entry):
    """The class built from the argument names it declares plus the manifest's args, in eval mode; its head count."""
    cls = load_class(entry)
    kwargs = {}
    for name in inspect.signature(cls.__init__).parameters:
        if name in WIDTH_NAMES:
            kwargs[name] = D
        elif name in HEAD_COUNT_NAMES:
            kwargs[name] = HEADS
        elif name in HEAD_SIZE_NAMES:
            kwargs[name] = HEAD_SIZE
    kwargs.update(entry["args"])
    heads = next((kwargs[n] for n in (*HEAD_COUNT_NAMES, "h") if n in kwargs), 1)
    torch.manual_seed(0)
    return cls(**kwargs).eval(), heads


def mask_as(convention, keep):
    """keep (B, L) bool, True = real token, written in a class's own mask convention."""
    if convention == "bool-pad":
        return ~keep
    if convention == "bool-keep":
        return keep
    if convention == "keep-01":
        return keep.long()
    if convention == "additive":
        return (~keep).float()[:, None, None, :] * -10000.0
    if convention == "pair-keep":
        return keep[:, None, :].expand(-1, keep.shape[1], -1)
    raise ValueError(convention)


def run(layer, file, x, keep=None, seed=2):
    """(out, weights or None). keep None: no padding (no mask where the mask is optional, all-keep where required)."""
    torch.manual_seed(seed)  # the same dropout draws for every call, so only a real difference shows
    kwargs = {}
    if file in MASKS:
        name, convention = MASKS[file]
        if keep is None and inspect.signature(layer.forward).parameters[name].default is inspect.Parameter.empty:
            keep = torch.ones(x.shape[:2], dtype=torch.bool)
        if keep is not None:
            kwargs[name] = mask_as(convention, keep)
    result = layer(x, **kwargs)
    return result if isinstance(result, tuple) else (result, None)


def _matrix(obj):
    """(weight (out, in), bias) of a projection: a Linear, a Sequential starting with one, or x @ W's W."""
    if isinstance(obj, nn.Sequential):
        return _matrix(obj[0])
    if isinstance(obj, nn.Linear):
        return obj.weight, obj.bias
    return obj.T, None  # a plain Parameter used as x @ W


def projections(layer):
    """(W, b) for queries, keys, values and the output projection (None where the class has none), by name."""
    for module in layer.modules():
        if isinstance(module, nn.MultiheadAttention):
            q, k, v = module.in_proj_weight.chunk(3)
            bq, bk, bv = module.in_proj_bias.chunk(3)
            return (q, bq), (k, bk), (v, bv), (module.out_proj.weight, module.out_proj.bias)
    if hasattr(layer, "linears"):  # the Annotated Transformer: W_Q, W_K, W_V, W_O in one ModuleList
        return tuple(_matrix(lin) for lin in layer.linears)
    fused = next((getattr(layer, n) for n in ("qkv", "to_qkv", "c_attn") if hasattr(layer, n)), None)
    if fused is not None:
        weight, bias = _matrix(fused)
        biases = (None,) * 3 if bias is None else bias.chunk(3)
        qkv = tuple(zip(weight.chunk(3), biases))
    else:
        qkv = tuple(
            _matrix(next(getattr(layer, n) for n in names if hasattr(layer, n)))
            for names in (
                ("W_Q", "W_q", "w_q", "W_query", "query", "q_proj"),
                ("W_K", "W_k", "w_k", "W_key", "key", "k_proj"),
                ("W_V", "W_v", "w_v", "W_value", "value", "v_proj"),
            )
        )
    out = next((getattr(layer, n) for n in ("W_O", "W_o", "w_o", "o_proj", "out_proj", "proj", "to_out", "c_proj")
                if hasattr(layer, n)), None)
    return (*qkv, None if out is None else _matrix(out))


def reference(layer, heads, x, scale=None):
    """softmax(Q Kᵀ · scale) V (W_O) from the layer's own projections; scale None is 1/√d_k. (out, weights)."""
    q, k, v, o = projections(layer)
    Q, K, V = (F.linear(x, w, b) for w, b in (q, k, v))
    n, length, _ = x.shape
    d = Q.shape[-1] // heads
    Q, K, V = (t.reshape(n, length, heads, d).transpose(1, 2) for t in (Q, K, V))  # (B, H, L, d)
    scores = Q @ K.transpose(-2, -1) * (1 / math.sqrt(d) if scale is None else scale)
    weights = scores.softmax(dim=-1)
    out = (weights @ V).transpose(1, 2).reshape(n, length, heads * d)
    return (out if o is None else F.linear(out, *o)), weights


def close(a, b):
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def best_scale(layer, heads, x, out):
    """The scale that brings the reference closest to the output (log-grid, then refined), and its relative error."""

    def error(log_scale):
        ref, _ = reference(layer, heads, x, scale=math.exp(log_scale))
        return ((ref - out).norm() / out.norm()).item() if ref.shape == out.shape else math.inf

    grid = [i / 10 for i in range(-80, 81)]  # scales from e^-8 to e^8
    low = min(grid, key=error)
    a, b = low - 0.1, low + 0.1
    for _ in range(30):  # ternary search on the bracket around the grid's best point
        m1, m2 = a + (b - a) / 3, b - (b - a) / 3
        a, b = (a, m2) if error(m1) < error(m2) else (m1, b)
    return math.exp((a + b) / 2), error((a + b) / 2)


def broken_properties(entry):
    """category → True (broken), False (kept) or None (cannot be checked for this class), on one (2, 5, 32) batch."""
    layer, heads = build(entry)
    file = entry["file"]
    torch.manual_seed(1)
    x = torch.randn(B, L, D)
    keep = torch.arange(L)[None, :] < torch.tensor(LENGTHS)[:, None]  # (B, L) True = real token
    d = projections(layer)[0][0].shape[0] // heads  # the width of one head's queries
    found = dict.fromkeys(CATEGORIES)

    with torch.no_grad():
        out, weights = run(layer, file, x)
        per_head = (B, heads, L, L)
        found["shapes"] = not (
            out.dim() == 3 and tuple(out.shape[:2]) == (B, L)
            and (weights is None or tuple(weights.shape) in {(B, L, L), per_head})
        )
        found["determinism"] = not torch.equal(out, run(layer, file, x, seed=3)[0])

        ref_out, ref_weights = reference(layer, heads, x)
        formula_broken = not close(out, ref_out)
        if weights is not None and not formula_broken and weights.numel() == ref_weights.numel():
            formula_broken = not close(weights.reshape(per_head), ref_weights)
        found["formula"] = formula_broken

        scale, error = best_scale(layer, heads, x, out)
        # broken: the output is the formula with another factor on the scores (a wrong formula is not a scale)
        found["scale"] = error < 1e-3 and abs(scale * math.sqrt(d) - 1) > 0.1

        perm = torch.tensor([4, 2, 0, 3, 1])
        found["permutation"] = not close(run(layer, file, x[:, perm])[0], out[:, perm])

        # with padding where the class takes a mask; a class without one only ever sees texts of one length
        batch_keep, lengths = (keep, LENGTHS) if file in MASKS else (None, (L,) * B)
        out_m, weights_m = run(layer, file, x, batch_keep)
        if weights is not None:
            rows_ok = all(
                (w >= 0).all() and torch.allclose(w.sum(-1), torch.ones(()), atol=1e-4) for w in (weights, weights_m)
            )
            found["softmax-rows"] = not rows_ok

        # padding: each text alone, cut to its real tokens, gives what it gave in the padded batch
        leaks = False
        for i, n in enumerate(lengths):
            alone, _ = run(layer, file, x[i : i + 1, :n], None if batch_keep is None else torch.ones(1, n).bool())
            leaks |= not close(alone[0], out_m[i, :n])
        if file in MASKS and weights_m is not None and weights_m.shape[-1] == L:
            on_padding = weights_m[0, ..., LENGTHS[0] :]
            leaks |= bool((on_padding.abs() > 1e-12).any())
        found["padding"] = leaks

        if file in MASKS:
            # a kept key blocked (exactly 0 in a real query's row) or a real token's output wiped
            blocked = False
            if weights_m is not None and weights_m.shape[-1] == L:
                for i, n in enumerate(LENGTHS):
                    blocked |= bool((weights_m[i, ..., :n, :n] == 0).any())
            for i, n in enumerate(LENGTHS):
                blocked |= bool((out_m[i, :n] == 0).all(dim=-1).any())
            found["mask-convention"] = blocked

    layer.zero_grad()
    out_g, _ = run(layer, file, x, batch_keep)
    (out_g * torch.randn_like(out_g)).sum().backward()
    # unreached, not merely small: a key bias gets (almost) no gradient in any correct layer, softmax ignores it
    found["gradient"] = any(p.grad is None for p in layer.parameters())
    return found


def test_manifest_lists_every_file_once_with_valid_fields():
    files = [e["file"] for e in CATALOGUE]
    on_disk = sorted(p.name for p in FOLDER.glob("*.py") if p.name not in ("catalogue.py", "__init__.py"))
    assert sorted(files) == on_disk
    assert len(CORRECT) >= 9 and len(BUGGY) >= 15
    for e in CATALOGUE:
        assert set(e) == {"file", "class_name", "correct", "args", "mistake", "expected"}, e["file"]
        assert set(e["expected"]) <= set(CATEGORIES), e["file"]
        assert bool(e["mistake"]) != e["correct"] and bool(e["expected"]) != e["correct"], e["file"]
    assert set(MASKS) <= set(files)


@pytest.mark.parametrize("entry", CATALOGUE, ids=entry_id)
def test_file_is_one_plain_class_with_a_header(entry):
    source = (FOLDER / entry["file"]).read_text()
    tree = ast.parse(source)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= {"torch", "math", "numpy"}, imported
    assert [n.name for n in tree.body if isinstance(n, ast.ClassDef)] == [entry["class_name"]]
    assert source.startswith("# ")  # the header naming the style it imitates
    comments = " ".join(line.split("#", 1)[1] for line in source.splitlines() if "#" in line).lower()
    if not entry["correct"]:  # written as a user makes the mistake, not announced
        assert not any(word in comments for word in ("bug", "wrong", "mistake", "incorrect", "should"))


@pytest.mark.parametrize("entry", CATALOGUE, ids=entry_id)
def test_class_builds_and_runs_with_and_without_padding(entry):
    layer, _ = build(entry)
    declared = inspect.signature(layer.forward).parameters
    assert (entry["file"] in MASKS) == (len(declared) > 1)  # every mask-taking class has its convention here
    torch.manual_seed(1)
    x = torch.randn(B, L, D)
    keep = torch.arange(L)[None, :] < torch.tensor(LENGTHS)[:, None]
    for mask in (None, keep) if entry["file"] in MASKS else (None,):
        out, weights = run(layer, entry["file"], x, mask)
        assert out.shape[:2] == (B, L) and torch.isfinite(out).all()
        assert weights is None or torch.isfinite(weights).all()


@pytest.mark.parametrize("entry", CORRECT, ids=entry_id)
def test_correct_class_is_the_reference_and_keeps_every_property(entry):
    found = broken_properties(entry)
    # the claim "correct": equal to softmax(Q Kᵀ/√d_k) V (W_O) from its own weights, nothing broken
    assert found["formula"] is False
    assert {c for c, broken in found.items() if broken} == set()


@pytest.mark.parametrize("entry", BUGGY, ids=entry_id)
def test_buggy_class_breaks_exactly_the_properties_it_names(entry):
    found = broken_properties(entry)
    assert {c: found[c] for c in entry["expected"]} == dict.fromkeys(entry["expected"], True), found
    if "determinism" not in entry["expected"]:  # a random output breaks every comparison: no claim beyond its own
        assert {c for c, broken in found.items() if broken} == set(entry["expected"])
