"""A stage a layer computed against the same stage of its definition recomputed: how much they differ (relative),
and how — a constant factor, the other axis, another operand, a mask that differs. Read by the contract on a run's
layers (monitor/contract.py) and on a user's class alone (monitor/layer_formula.py)."""

import math

import torch

from monitor.thresholds import FORMULA_TOLERANCE

MATCH = 1e-2  # a candidate explanation ("× c", "other axis", "other operand") fits when its residual is below this


def first_difference(found: list[tuple[str, float, str]]) -> dict:
    """{"stage", "difference", "how", "largest"}: the first (stage, difference, how) at or above FORMULA_TOLERANCE."""
    first = next(((stage, value, how) for stage, value, how in found if value >= FORMULA_TOLERANCE), None)
    largest = max((value for _, value, _ in found), default=math.nan)
    if first is None:
        return {"stage": None, "difference": largest, "how": "", "largest": largest}
    return {"stage": first[0], "difference": first[1], "how": first[2], "largest": largest}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b| (0 when both are empty)."""
    if a.numel() == 0:
        return 0.0
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-12))


def factor_of(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """The c that makes c·b closest to a, and the residual relative(a, c·b)."""
    c = float((a * b).sum() / (b * b).sum().clamp(min=1e-300))
    return c, relative(a, c * b) if c else math.inf


def differ(a: torch.Tensor, b: torch.Tensor, candidates: dict[str, torch.Tensor] | None = None) -> tuple[float, str]:
    """How much a stage differs from the reference (relative), and how: a constant factor, or the candidate (another
    axis, another operand) it equals up to a factor; "" when it matches."""
    difference = relative(a, b)
    if difference < FORMULA_TOLERANCE:
        return difference, ""
    c, residual = factor_of(a, b)
    if residual < MATCH:
        return difference, f"{c:.3g} × the formula's (a constant factor)"
    for name, candidate in (candidates or {}).items():
        if candidate.shape != a.shape:
            continue
        c, residual = factor_of(a, candidate)
        if residual < MATCH:
            return difference, name + ("" if abs(c - 1) < MATCH else f", × {c:.3g}")
    return difference, f"differs by up to {difference:.3g} of its size, no constant factor"


def centred(scores: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Scores minus their row mean over `where`, 0 elsewhere (softmax ignores a constant added to a row)."""
    kept = where.to(scores.dtype)
    values = scores.masked_fill(~where, 0.0)
    mean = values.sum(dim=-1, keepdim=True) / kept.sum(dim=-1, keepdim=True).clamp(min=1)
    return (values - mean) * kept


def compare_scores(scores, allowed, ref, rows) -> tuple[str, float, str]:
    """The scores where both the layer and the definition let a real query see a key, row-centred."""
    both = allowed & ref.allowed & rows[:, None, :, None]
    a, b = centred(scores, both), centred(ref.scores, both)
    raw = {"keys and queries swapped (Kᵀ Q: the other axis)": ref.k @ ref.q.transpose(-2, -1),
           "Q Qᵀ (another operand: the queries as keys)": ref.q @ ref.q.transpose(-2, -1),
           "K Kᵀ (another operand: the keys as queries)": ref.k @ ref.k.transpose(-2, -1),
           "Q Vᵀ (another operand: the values as keys)": ref.q @ ref.v.transpose(-2, -1)}
    candidates = {name: centred(value, both) for name, value in raw.items() if value.shape == scores.shape}
    return ("scores", *differ(a, b, candidates))


def compare_mask(allowed, ref, rows, padding) -> tuple[str, float, str]:
    """Keys a real query may see by the layer (allowed, or given weight) against the definition's."""
    real = rows[:, None, :, None]
    seen = allowed & real  # weight given where the layer's own mask blocks is the weights' stage
    extra, missing = seen & ~ref.allowed, ref.allowed & ~allowed & real
    total = max(int((ref.allowed & real).sum()), 1)
    difference = (int(extra.sum()) + int(missing.sum())) / total
    if difference == 0:
        return "mask", 0.0, ""
    parts = []
    if extra.any():
        K = extra.shape[-1]
        on_padding = int((extra & padding[:, None, None, :K]).sum()) if K == padding.shape[1] else 0
        parts.append(f"{int(extra.sum())} places the definition blocks are seen"
                     + (f" ({on_padding} of them padding)" if on_padding else ""))
    if missing.any():
        L = missing.shape[-1]
        later = torch.ones(L, L, dtype=torch.bool, device=missing.device).triu(1) if L == rows.shape[1] else None
        look_ahead = later is not None and not (missing & ~later).any()
        parts.append(f"{int(missing.sum())} keys the definition allows are blocked"
                     + (" (all of them later tokens: a look-ahead mask)" if look_ahead else ""))
    return "mask", difference, "a mask that differs: " + "; ".join(parts)


def compare_weights(weights, ref, rows, padding) -> tuple[str, float, str]:
    """The weights of real queries' rows (absolute: they lie in 0..1)."""
    a, b = weights[rows[:, None].expand_as(weights[..., 0])], ref.weights[rows[:, None].expand_as(ref.weights[..., 0])]
    difference = float((a - b).abs().max()) if a.numel() else 0.0
    if difference < FORMULA_TOLERANCE:
        return "weights", difference, ""
    sums = a.sum(dim=-1)
    if ref.scores.shape == weights.shape:  # softmax over the queries, compared where the definition allows a key
        # The padded queries' scores as a layer that zeroes padded queries has them (0): they share the column.
        padded = padding[:, None, :, None] & ref.allowed
        over_queries = ref.scores.masked_fill(padded, 0.0).softmax(dim=-2).nan_to_num(0.0)
        picked = rows[:, None].expand_as(weights[..., 0])
        allowed = ref.allowed.expand_as(weights)[picked]
        if relative(a * allowed, over_queries[picked] * allowed) < MATCH:
            return "weights", difference, "softmax over the queries (the other axis)"
    c, residual = factor_of(a, b)
    if residual < MATCH:
        return "weights", difference, f"{c:.3g} × the formula's (a constant factor; rows sum to {c:.3g})"
    return "weights", difference, (f"differ by up to {difference:.3g}; rows sum to {float(sums.min()):.3g}–"
                                   f"{float(sums.max()):.3g}")


def operands(ref, rows) -> dict[str, torch.Tensor]:
    """The heads' output with another operand than V: the keys, the queries (B, L, H·d) at real rows."""
    found = {}
    for name, operand in (("the weights mix K instead of V (another operand)", ref.k),
                          ("the weights mix Q instead of V (another operand)", ref.q)):
        if operand.shape == ref.v.shape:
            found[name] = (ref.weights @ operand).transpose(1, 2).flatten(2)[rows]
    return found
