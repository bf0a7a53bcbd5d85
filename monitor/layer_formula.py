"""The formula on one attention layer, from its own weights: where its projections are, softmax(Q Kᵀ/√d_k) V (W_O)
recomputed from them in float64 by the independent reference (monitor/reference.py's dense_reference: torch's own
multi-head attention), stage by stage against what the layer computed, and the spread of its scores against what
1/√d_k gives. monitor/layer_contract.py runs these as two of its checks ("formula", "scale").

Projections are found by name on the user's module (W_Q, w_q, q_proj, query, to_q, …; one fused qkv / to_qkv /
c_attn / in_proj split in three; nn.MultiheadAttention's in_proj_weight and out_proj; the Annotated Transformer's
`linears` list of four) or mapped by the user ({"q": "attr", "k": …, "v": …, "o": …} or {"qkv": "attr"}). A
module's weight is used as nn.Linear uses it (x Wᵀ + b); a bare matrix as the textbook writes it (x W), whichever of
its sides has the model width. Heads are split the standard way: (B, L, H·d) → (B, H, L, d).

Letters in the shape comments: B texts, L tokens, H heads, d head size, D model width.
"""

import math
from dataclasses import dataclass, field, replace
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import merge_heads, split_heads
from model.own_attention import ROLE_NAMES, normal
from monitor.reference import dense_reference
from monitor.stage_compare import (MATCH, centred, compare_mask, compare_scores, compare_weights, differ,
                                   factor_of, first_difference, operands, relative)

HEAD_ATTRIBUTES = ("n_heads", "num_heads", "heads", "n_head", "nhead", "num_attention_heads", "h", "head_count")


@dataclass
class Projections:
    """A layer's projections as F.linear weights: q, k, v (weight (out, D), bias or None), o the same or None."""

    q: tuple
    k: tuple
    v: tuple
    o: tuple | None
    heads: int
    names: dict = field(default_factory=dict)  # role → the attribute it was read from
    o_module: nn.Module | None = None  # the module whose input is the heads' output (hooked for that stage)
    key_bias: torch.Tensor | None = None  # K's own bias parameter: the formula gives it no gradient
    others: list = field(default_factory=list)  # the user's parameters none of the projections read
    in_module: nn.Module | None = None  # the module whose input is what the projections read (hooked: a
    # LayerNorm inside the class is then before what the formula is recomputed from)

    def describe(self) -> str:
        return ", ".join(f"{role}={name}" for role, name in self.names.items())


def resolve(user: nn.Module, path: str):
    """The module or tensor at an attribute path of the user's module (ValueError naming it when absent)."""
    target = user
    for part in path.split("."):
        if isinstance(target, (nn.ModuleList, nn.Sequential)) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        elif hasattr(target, part):
            target = getattr(target, part)
        else:
            raise ValueError(f"--map: {type(user).__name__} has no attribute {path!r}")
    return target


def first_linear(module):
    """The module itself, or the first nn.Linear inside a Sequential (to_out = Sequential(Linear, Dropout))."""
    if isinstance(module, nn.Sequential):
        return next((m for m in module if isinstance(m, nn.Linear)), None)
    return module


def as_linear(obj, width_in: int) -> list[tuple]:
    """The ways obj can project a (…, width_in) input, as (weight (out, width_in), bias): one for a module or an
    oblong matrix, both orientations for a square bare matrix. [] when it cannot."""
    obj = first_linear(obj)
    if isinstance(obj, nn.Linear):
        return [(obj.weight, obj.bias)] if obj.in_features == width_in else []
    if isinstance(obj, nn.Module) and isinstance(getattr(obj, "weight", None), torch.Tensor):  # transformers' Conv1D
        obj = obj.weight
    if not isinstance(obj, torch.Tensor) or obj.ndim not in (2, 3):
        return []
    if obj.ndim == 3:  # einsum style: (D, H, d) or (H, D, d) into the heads, (H, d, D) out of them
        if obj.shape[0] == width_in:
            return [(obj.flatten(1).T, None)]
        if obj.shape[1] == width_in:
            return [(obj.transpose(0, 1).flatten(1).T, None)]
        if obj.shape[0] * obj.shape[1] == width_in:
            return [(obj.flatten(0, 1).T, None)]
        return []
    found = []
    if obj.shape[0] == width_in:
        found.append((obj.T, None))  # x W
    if obj.shape[1] == width_in:
        found.append((obj, None))  # x Wᵀ
    return found


def named_candidates(user: nn.Module):
    """(path, object) for every submodule and parameter of the user's module, shallowest first."""
    found = [(name, module) for name, module in user.named_modules() if name]
    found += list(user.named_parameters())
    return sorted(found, key=lambda item: item[0].count("."))


def heads_of(user: nn.Module, given: int | None) -> int:
    for module in (user, *user.modules()):
        if isinstance(module, nn.MultiheadAttention):
            return module.num_heads
    for name in HEAD_ATTRIBUTES:
        value = getattr(user, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value
    return given or 1


def find_projections(user: nn.Module, d_model: int, heads: int | None = None,
                     mapping: dict[str, str] | None = None) -> list[Projections]:
    """The layouts the user's projections can be read in, the likeliest first; [] when Q, K and V are not found."""
    heads = heads_of(user, heads)
    mha = next((m for m in user.modules() if isinstance(m, nn.MultiheadAttention)), None)
    if mapping:
        found = {role: resolve(user, path) for role, path in mapping.items()}
        names = dict(mapping)
    elif mha is not None:
        return multihead_projections(user, mha)
    else:
        found, names = {}, {}
        for path, obj in named_candidates(user):
            role = next((r for r, words in ROLE_NAMES.items() if normal(path) in words), None)
            if role and role not in found and (isinstance(obj, torch.Tensor) or first_linear(obj) is not None):
                found[role], names[role] = obj, path
            if normal(path) == "linears" and isinstance(obj, nn.ModuleList) and len(obj) in (3, 4):
                for role, module in zip("qkvo", obj):  # the Annotated Transformer's clones(nn.Linear, 4)
                    found.setdefault(role, module)
                    names.setdefault(role, f"{path}.{'qkvo'.index(role)}")
    layouts = []
    if all(role in found for role in "qkv"):
        ways = [as_linear(found[role], d_model) for role in "qkv"]
        if not all(ways):
            return []
        # a square bare matrix reads both ways (x W, x Wᵀ): one layout of each, the textbook's first
        layouts = [{role: w[min(i, len(w) - 1)] for role, w in zip("qkv", ways)} for i in range(max(map(len, ways)))]
    elif "qkv" in found:
        for weight, bias in as_linear(found["qkv"], d_model):
            layouts += fused_layouts(weight, bias, heads)
    if not layouts:
        return []
    inner = layouts[0]["q"][0].shape[0]
    o_ways = as_linear(found["o"], inner) if "o" in found else []
    o_module = first_linear(found["o"]) if isinstance(found.get("o"), nn.Module) else None
    key = first_linear(found.get("k"))
    key_bias = key.bias if isinstance(key, nn.Linear) else None
    read = {id(p) for obj in found.values() for p in (obj.parameters() if isinstance(obj, nn.Module) else [obj])}
    others = [name for name, p in user.named_parameters() if id(p) not in read]
    first = found.get("q", found.get("qkv"))
    in_module = first_linear(first) if isinstance(first, nn.Module) else None
    return [Projections(layout["q"], layout["k"], layout["v"], o, heads, names, o_module, key_bias, others, in_module)
            for layout in layouts for o in (o_ways or [None])]


def fused_layouts(weight: torch.Tensor, bias, heads: int) -> list[dict]:
    """A fused (3·H·d, D) projection split in three: [Q | K | V] (chunk), or per head [q k v] (view(H, 3, d))."""
    if weight.shape[0] % 3:
        return []
    inner = weight.shape[0] // 3
    chunked = dict(zip("qkv", zip(weight.chunk(3), bias.chunk(3) if bias is not None else (None,) * 3)))
    if inner % heads:
        return [chunked]
    d = inner // heads
    per_head = lambda t, i: t.view(heads, 3, d, *t.shape[1:])[:, i].flatten(0, 1)  # noqa: E731
    interleaved = {role: (per_head(weight, i), None if bias is None else per_head(bias, i))
                   for i, role in enumerate("qkv")}
    return [chunked, interleaved]


def multihead_projections(user, mha: nn.MultiheadAttention) -> list[Projections]:
    """nn.MultiheadAttention's weights: one in_proj_weight [Q | K | V], or its three separate ones, and out_proj."""
    if mha.in_proj_weight is not None:
        weights = mha.in_proj_weight.chunk(3)
    else:
        weights = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
    biases = mha.in_proj_bias.chunk(3) if mha.in_proj_bias is not None else (None,) * 3
    path = next(name for name, m in user.named_modules() if m is mha) or "(the module)"
    names = {"q": f"{path}.in_proj_weight", "o": f"{path}.out_proj"}
    others = [name for name, p in user.named_parameters() if all(p is not q for q in mha.parameters())]
    return [Projections(*zip(weights, biases), (mha.out_proj.weight, mha.out_proj.bias), mha.num_heads,
                        names, mha.out_proj, None, others, mha)]


def project(x: torch.Tensor, linear: tuple) -> torch.Tensor:
    weight, bias = linear
    return F.linear(x, weight.detach().double(), None if bias is None else bias.detach().double())


def reference(proj: Projections, x: torch.Tensor, allowed: torch.Tensor):
    """The definition on x (B, L, D), float64, over the allowed keys (B, 1, L, L): model/attention.py's Reference,
    or None when the keys' head size differs from the queries'. Values wider than the queries (W_V d_model × d_model
    beside W_Q d_model × d_k, as numpy-style course code writes one head) are weighted by the reference's weights."""
    q, k, v = (split_heads(project(x, p), proj.heads) for p in (proj.q, proj.k, proj.v))
    if q.shape != k.shape or q.shape[:-1] != v.shape[:-1]:
        return None
    d = q.shape[-1]
    if v.shape != q.shape:
        ref = reference(replace(proj, v=proj.q, o=None), x, allowed)  # scores and weights; values apart
        heads = merge_heads(ref.weights @ v)  # (B, L, H·d_v)
        out = project(heads, proj.o) if proj.o is not None else heads
        return ref._replace(heads=heads, out=out, v=v)
    inner = proj.heads * d
    w_o = SimpleNamespace(weight=torch.eye(inner, dtype=x.dtype), bias=None)
    if proj.o is not None:
        w_o = SimpleNamespace(weight=proj.o[0].detach(), bias=None if proj.o[1] is None else proj.o[1].detach())
    return dense_reference(SimpleNamespace(w_o=w_o), q, k, v, allowed, 1.0 / math.sqrt(d))


def score_mistake(proj: Projections, x: torch.Tensor, w: torch.Tensor, ref, rows: torch.Tensor) -> str:
    """How the layer's scores (log w, up to a row's constant) differ, where monitor/contract.py's candidates do not
    say: heads split wrongly. "" when none fits."""
    B, L, _ = x.shape
    H, d = proj.heads, ref.q.shape[-1]
    q, k = (project(x, p).view(B, H, L, d) for p in (proj.q, proj.k))
    both = (w > 0) & ref.allowed & rows[:, None, :, None]
    found = {"heads split wrongly: (B, L, H·d) viewed as (B, H, L, d) without the transpose": q @ k.transpose(-2, -1)}
    for name, scores in found.items():
        c, residual = factor_of(centred(w.log(), both), centred(scores, both))
        if residual < MATCH:
            return name + ("" if abs(c * math.sqrt(d) - 1) < MATCH else f", × {c * math.sqrt(d):.3g}")
    return ""


def plain(q, k, v, allowed, scale, axis=-1):
    """softmax(q kᵀ · scale) v over the allowed keys, softmax along `axis`: the variants a mistake gives."""
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~allowed, -math.inf)
    return scores.softmax(dim=axis).nan_to_num(0.0) @ v


def variants(proj: Projections, x: torch.Tensor, allowed: torch.Tensor, ref) -> dict[str, torch.Tensor]:
    """The heads' output (B, L, H·d) as common mistakes compute it, by name, to say how an output differs."""
    B, L, _ = x.shape
    H, d, dv = proj.heads, ref.q.shape[-1], ref.v.shape[-1]
    q, k, v, scale = ref.q, ref.k, ref.v, 1.0 / math.sqrt(d)
    found = {
        "the scores not scaled (no 1/√d_k)": merge_heads(plain(q, k, v, allowed, 1.0)),
        "the scores divided by d_k (1/√d_k twice)": merge_heads(plain(q, k, v, allowed, scale**2)),
        "softmax over the queries (the other axis)": merge_heads(plain(q, k, v, allowed, scale, axis=-2)),
        "Q Qᵀ (another operand: the queries as keys)": merge_heads(plain(q, q, v, allowed, scale)),
        "Kᵀ Q (keys and queries swapped)": merge_heads(plain(k, q, v, allowed, scale)),
        "the padding mask not applied": merge_heads(plain(q, k, v, torch.ones_like(allowed), scale)),
        "a look-ahead (causal) mask": merge_heads(plain(q, k, v, allowed & torch.ones(L, L, dtype=torch.bool).tril(),
                                                  scale)),
        "heads merged wrongly: (B, H, L, d) reshaped to (B, L, H·d) without moving H back":
            ref.heads.view(B, L, H, dv).transpose(1, 2).reshape(B, L, H * dv),
    }
    if dv == d:
        wrong_split = [project(x, p).view(B, H, L, d) for p in (proj.q, proj.k, proj.v)]
        found["heads split wrongly: (B, L, H·d) viewed as (B, H, L, d) without the transpose"] = \
            plain(*wrong_split, allowed, scale).reshape(B, L, H * d)
    if x.shape[-1] == H * d:
        found["V = X: the values are the input itself (W_V skipped)"] = merge_heads(ref.weights @ split_heads(x, H))
    return found


@dataclass
class FormulaResult:
    stage: str | None  # the first stage that differs, None: all match
    difference: float
    how: str
    largest: float
    projections: Projections
    stages: list = field(default_factory=list)  # the stages compared, by name


def allowed_keys(padding: torch.Tensor, causal: bool = False) -> torch.Tensor:
    """(B, 1, L, L) True where a query may see a key: every real key, and (causal) none after the query."""
    B, L = padding.shape
    allowed = (~padding)[:, None, None, :].expand(B, 1, L, L)
    return allowed & torch.ones(L, L, dtype=torch.bool, device=padding.device).tril() if causal else allowed


def compare_layer(proj: Projections, seen, padding: torch.Tensor, causal: bool = False) -> FormulaResult:
    """The user's stages (seen: what the layer's module received and returned) against the reference; causal: the
    reference with its look-ahead mask (the class's family, found by probing)."""
    x = seen.x.double()
    B, L, _ = x.shape
    allowed = allowed_keys(padding, causal)
    ref = reference(proj, x, allowed)
    if ref is None:
        return FormulaResult("output", math.inf, "the keys' head size differs from the queries'", math.inf, proj)
    rows = ~padding
    found = []
    weights = seen.weights
    if weights is not None and weights.shape[-2:] == (L, L) and weights.shape[0] == B:
        w = weights.double().reshape(B, -1, L, L)
        if w.shape[1] == proj.heads:
            scoring = ref._replace(v=ref.q)  # the score stages read no values (wider values: another shape)
            scores = compare_scores(w.log(), w > 0, scoring, rows)
            mask = compare_mask(w > 0, scoring, rows, padding)
            weigh = compare_weights(w, scoring, rows, padding)
            if "no constant factor" in scores[2]:
                scores = ("scores", scores[1], score_mistake(proj, x, w, ref, rows) or scores[2])
            if "no constant factor" in scores[2] and weigh[2] and "differ by up to" not in weigh[2]:
                scores = ("scores", 0.0, "")  # the weights stage says how (softmax over the other axis)
            found += [mask, scores, weigh]
        elif w.shape[1] == 1:  # averaged over the heads, as nn.MultiheadAttention hands them out
            found.append(compare_weights(w, ref._replace(weights=ref.weights.mean(1, keepdim=True)), rows, padding))
    named = variants(proj, x, allowed, ref)
    if seen.heads is not None and seen.heads.shape == ref.heads.shape:
        heads = seen.heads.double()
        found.append(("output before W_O", *differ(heads[rows], ref.heads[rows],
                                                   operands(ref, rows) | {n: t[rows] for n, t in named.items()})))
    out, target = seen.out.double(), ref.out if proj.o is not None else ref.heads
    if proj.o is None and proj.others:  # an output projection not found by name may be among them: not compared
        first = first_difference(found)
        return FormulaResult(first["stage"], first["difference"], first["how"], first["largest"], proj,
                             [stage for stage, _, _ in found])
    if out.shape != target.shape:
        return FormulaResult("output", math.inf, f"the output has shape {tuple(out.shape)}, the formula's "
                             f"{tuple(target.shape)}", math.inf, proj)
    through = (lambda t: project(t, proj.o)) if proj.o is not None else (lambda t: t)  # noqa: E731
    candidates = {"W_O left out": ref.heads[rows]} if proj.o is not None else {}
    candidates |= {name: through(t)[rows] for name, t in named.items()}
    found.append(("output", *differ(out[rows], target[rows], candidates)))
    first = first_difference(found)
    return FormulaResult(first["stage"], first["difference"], first["how"], first["largest"], proj,
                         [stage for stage, _, _ in found])


def score_factor(proj: Projections, seen, padding: torch.Tensor, causal: bool = False) -> tuple[float, str, bool]:
    """How many times the spread of the layer's scores is what 1/√d_k gives, how it was read (from the weights it
    hands out: log w is the scores up to a constant a row; else fitted on its output), and whether the scores are
    exactly that multiple of Q Kᵀ/√d_k (the fit on the output, or log w, within MATCH). NaN when neither works."""
    x = seen.x.double()
    B, L, _ = x.shape
    allowed = allowed_keys(padding, causal)
    ref = reference(proj, x, allowed)
    if ref is None:
        return math.nan, "", False
    real = (~padding)[:, None, :, None]
    weights = seen.weights
    if weights is not None and weights.shape[0] == B and weights.shape[-2:] == (L, L):
        w = weights.double().reshape(B, -1, L, L)
        if w.shape[1] == proj.heads:
            where = (w > 0) & allowed & real
            factor = spread(w.log(), where) / spread(ref.scores, where)
            _, residual = factor_of(centred(w.log(), where), centred(ref.scores, where))
            return factor, "the spread of log(weights)", residual < MATCH
    if proj.o is None and seen.out.shape != ref.heads.shape or proj.o is not None and seen.out.shape != ref.out.shape:
        return math.nan, "", False
    out = seen.out.double()[~padding]
    best = (math.inf, math.nan)
    for factor in torch.logspace(-5, 5, 201, base=2).tolist():  # 2^-5 … 2^5 in steps of 2^0.05
        heads = merge_heads(plain(ref.q, ref.k, ref.v, allowed, factor / math.sqrt(ref.q.shape[-1])))
        fitted = heads if proj.o is None else project(heads, proj.o)
        best = min(best, (relative(out, fitted[~padding]), factor))
    residual, factor = best
    if residual >= MATCH:
        # beyond the grid's ends: the scores' spread of an output that is one-hot or uniform is told by the ends
        for factor, name in ((256.0, "one-hot"), (1 / 256, "uniform")):
            heads = merge_heads(plain(ref.q, ref.k, ref.v, allowed, factor / math.sqrt(ref.q.shape[-1])))
            fitted = heads if proj.o is None else project(heads, proj.o)
            if relative(out, fitted[~padding]) < MATCH:
                return factor, f"fitted on the output (rows {name})", False
        return math.nan, "", False
    return factor, "fitted on the output", True


def spread(scores: torch.Tensor, where: torch.Tensor) -> float:
    """The root mean square of the scores at `where`, each row centred (softmax ignores a row's constant)."""
    kept = where.to(scores.dtype)
    values = scores.masked_fill(~where, 0.0)
    mean = values.sum(-1, keepdim=True) / kept.sum(-1, keepdim=True).clamp(min=1)
    centred = (values - mean) * kept
    return float((centred.pow(2).sum() / kept.sum().clamp(min=1)).sqrt())


