"""Which family of attention a layer belongs to, found by running it, and printed before the verdicts as its
identity line (monitor/layer_contract.py); and each family's contract: the checks it judges its own way, where a
check's own judge assumes the position-free, unmasked formula (FAMILIES, consulted by by_family).

    mask        none / padding (its convention) / causal / causal + padding: causal when no output moves as the
                later tokens change (model/own_attention/mask_probe.py), padding when the adapter found a convention
    positions   none: the output follows a permutation of the tokens (causal: the last token's output ignores the
                order of the tokens before it); else, from the weights it hands out or that are seen,
                    bias      log w − Q Kᵀ/√d_k (row-centred) is the same on other content: an additive bias that
                              does not depend on the content (ALiBi, a learned relative bias)
                    relative  the scores of two tokens do not move when both are shifted by tokens put in front:
                              a rotation of Q and K (RoPE-like)
                    absolute  order matters and neither explains it (a position embedding inside, or a mistake)
    weights     where they come from: returned / an attribute / a softmax seen / a fused call recomputed / none
    norm        a normalisation module inside: before the projections (pre-norm) or after them (post-norm)

A new family is one FamilyUnit in FAMILIES: which layers belong to it (its kind's definition, or what probing found
here) and the checks it judges its own way, by name. The families now: keys laid out by position by the kind's
definition (a window, the look-ahead: permutation a NOTE), position terms (formula from the weights used, scale and
permutation NOTEs), causal (permutation of the tokens before the last, later tokens changed in the look-ahead check).

Letters in the shape comments: B batch, H heads, L tokens, S tokens put in front, D model width.
"""

import math
from dataclasses import dataclass
from typing import Callable

import torch

from model.attention import merge_heads, split_heads
from monitor.layer_behaviour import sees_itself
from monitor.layer_formula import project
from monitor.layer_probe import Outcome, Probe, changed, figure, rounding
from monitor.stage_compare import centred, differ, relative
from monitor.thresholds import FORMULA_TOLERANCE, INVARIANCE

SHIFT = 3  # tokens put in front by the relative-position test
POSITION_MATCH = 1e-3  # relative difference of row-centred log-weights that counts as the same scores
OUTPUT_FIX = "return W_O applied once to the merged heads' output: out = W_O((weights @ V) merged)"


@dataclass(frozen=True)
class Family:
    causal: bool
    padding: str  # the mask convention the adapter found, "" when the layer takes none
    positions: str  # "none", "bias", "relative", "absolute"
    weights: str  # where the weights come from
    norm: str  # "none", "pre-norm", "post-norm", "inside"

    @property
    def position_free(self) -> bool:
        return self.positions == "none"

    @property
    def position_terms(self) -> bool:
        """Positions of a family the contract knows: a content-free bias or relative scores."""
        return self.positions in ("bias", "relative")

    def line(self) -> str:
        mask = ("causal" if self.causal else "") + (" + " if self.causal and self.padding else "")
        mask = (mask + (f"padding ({self.padding})" if self.padding else "")) or "none"
        positions = {"none": "none", "bias": "an additive bias that does not depend on the content (ALiBi-like, a "
                     "learned relative bias)", "relative": "relative: scores unchanged when both tokens shift (a "
                     "rotation of Q and K, RoPE-like)", "absolute": "order matters, not as a content-free bias or "
                     "relative scores (absolute positions, or a mistake)", "unknown": "order matters (its weights "
                     "cannot be seen to tell how)"}[self.positions]
        norm = {"none": "none", "pre-norm": "before the projections (pre-norm)", "post-norm": "after the output "
                "projection (post-norm)", "inside": "a norm module inside"}[self.norm]
        return f"identity: mask {mask}; positions {positions}; weights {self.weights}; normalisation inside {norm}"


def find_family(probe) -> Family:
    """The layer's family (cached on the probe)."""
    if "family" not in probe.cache:
        probe.cache["family"] = Family(probe.causal, padding_convention(probe), positions(probe),
                                       weights_source(probe), norm_inside(probe))
    return probe.cache["family"]


def padding_convention(probe) -> str:
    convention = probe.layer.mask_convention
    if convention is None:  # the classifier's own (model/kind.py)
        return "bool True = padding, the built-in layer's"
    if convention.call == "none":
        return ""
    call = "forward(x, mask)" if convention.call == "positional" else f"{convention.call}="
    return f"{call}, {convention.kind}, {convention.shape}"


def weights_source(probe) -> str:
    return probe.layer.weights_from or "none seen (no heatmaps; the output checks still run)"


def norm_inside(probe) -> str:
    """Where a normalisation module inside the class runs: before the projections read, or after its output
    projection. Found from the order its modules run in."""
    norms = [m for m in probe.user.modules() if "norm" in type(m).__name__.lower() and m is not probe.user]
    if not norms:
        return "none"
    layouts = probe.projections
    first = layouts[0].in_module if layouts else None
    last = layouts[0].o_module if layouts else None
    order, hooks = [], []
    for module in {id(m): m for m in (*norms, first, last) if m is not None}.values():
        hooks.append(module.register_forward_hook(lambda m, args, out: order.append(m)))
    try:
        probe.call(probe.x)
    except Exception:  # the shapes check reports a layer that cannot run
        return "inside"
    finally:
        for hook in hooks:
            hook.remove()
    ran = [next((i for i, m in enumerate(order) if m is n), None) for n in norms]
    ran = [i for i in ran if i is not None]
    if not ran:
        return "none"
    if first is not None and first in order and min(ran) < order.index(first):
        return "pre-norm"
    if last is not None and last in order and max(ran) > order.index(last):
        return "post-norm"
    return "inside"


def post_norm_residual(probe, o_out: torch.Tensor | None, out: torch.Tensor | None) -> tuple[str, str]:
    """Post-norm's contract past W_O: the output is the class's norm of its input plus W_O's output, LayerNorm(x +
    attention), as the Transformer's post-norm sublayer writes it. ("residual", the norm's name) when it is;
    ("missing", name) when it is the norm of W_O's output alone (the residual left out); ("", "") when neither (the
    formula then ends at W_O, as for any class that adds more after it)."""
    x, real = probe.x, probe.real()
    if o_out is None or out is None or o_out.shape != x.shape or out.shape != x.shape:
        return "", ""
    for name, norm in probe.user.named_modules():
        if "norm" not in type(norm).__name__.lower() or norm is probe.user:
            continue
        try:
            with torch.no_grad():
                kept, left = norm(x + o_out), norm(o_out)
        except Exception:  # a norm of another width (the heads', the queries'): not the one after W_O
            continue
        if relative(out.double()[real], kept.double()[real]) < FORMULA_TOLERANCE:
            return "residual", name
        if relative(out.double()[real], left.double()[real]) < FORMULA_TOLERANCE:
            return "missing", name
    return "", ""


def positions(probe) -> str:
    """none / bias / relative / absolute / unknown, as the module docstring says."""
    if probe.layer.positions_inside is not None:  # a kind whose definition says (model/kind.py)
        return probe.layer.positions_inside
    x = probe.x
    try:
        if order_free(probe, x):
            return "none"
        weights = probe.call(x).weights
    except Exception:  # the shapes check reports a layer that cannot run
        return "none"
    if weights is None:
        return "unknown"
    allowed = allowed_here(x.shape[1], probe.causal)
    if not bool((weights > 0)[..., allowed].all()):
        return "absolute"  # keys blocked beyond the family's mask: not positions, the formula check names it
    if not in_scores(probe, x, weights, allowed):
        return "absolute"  # the weights are position-free: order enters elsewhere (a mistake, or positions added)
    if content_free(probe, x, weights, allowed):
        return "bias"
    if shift_invariant(probe, x, weights):
        return "relative"
    return "absolute"


def in_scores(probe, x: torch.Tensor, weights: torch.Tensor, allowed: torch.Tensor) -> bool:
    """Whether positions are in the scores: log w departs from Q Kᵀ/√d_k (projections found), or, without them,
    permuting the tokens does not permute the weights (a layer that is not causal)."""
    if probe.projections:
        found = departure(probe, probe.call(x), allowed)
        return found is not None and float(found.abs().max()) >= POSITION_MATCH
    if probe.causal:
        return False
    order = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(probe.seed + 17))
    permuted = probe.call(x[:, order]).weights
    return permuted is None or change(permuted, weights[..., order, :][..., order]) >= POSITION_MATCH


def allowed_here(L: int, causal: bool) -> torch.Tensor:
    keys = torch.ones(L, L, dtype=torch.bool)
    return keys.tril() if causal else keys


def order_free(probe, x: torch.Tensor) -> bool:
    """Position-free: permuting the tokens permutes the output; causal: the last token's output ignores the order
    of the tokens before it."""
    L = x.shape[1]
    generator = torch.Generator().manual_seed(probe.seed + 7)
    plain = probe.call(x).out
    if probe.causal:
        order = torch.cat([torch.randperm(L - 1, generator=generator), torch.tensor([L - 1])])
        moved = probe.call(x[:, order]).out[:, -1]
        return change(moved, plain[:, -1]) < INVARIANCE
    order = torch.randperm(L, generator=generator)
    return change(probe.call(x[:, order]).out, plain[:, order]) < INVARIANCE


def content_free(probe, x: torch.Tensor, weights: torch.Tensor, allowed: torch.Tensor) -> bool:
    """log w − Q Kᵀ/√d_k, row-centred over the allowed keys, is the same on another input: the scores hold an
    additive term that does not depend on the content."""
    if not probe.projections:
        return False
    other = torch.randn(x.shape, generator=torch.Generator().manual_seed(probe.seed + 11))
    seen = probe.call(other)
    if seen.weights is None:
        return False
    first = departure(probe, probe.call(x), allowed)
    second = departure(probe, seen, allowed)
    if first is None or second is None:
        return False
    return change(second, first) < POSITION_MATCH


def departure(probe, seen, allowed: torch.Tensor):
    """(B, H, L, L) log w − Q Kᵀ/√d_k row-centred over the allowed keys, Q and K from what the projections read;
    None when the heads do not line up."""
    layout = probe.projections[0]
    read = seen.x.double()
    q, k = (split_heads(project(read, p), layout.heads) for p in (layout.q, layout.k))
    w = seen.weights.double()
    if w.shape[1] != layout.heads:
        return None
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    where = allowed.expand_as(w)
    return centred(w.clamp(min=1e-300).log() - scores, where)


def shift_invariant(probe, x: torch.Tensor, weights: torch.Tensor) -> bool:
    """Tokens put in front of the text do not change how two of its tokens score each other: relative positions."""
    B, L, D = x.shape
    front = torch.randn(B, SHIFT, D, generator=torch.Generator().manual_seed(probe.seed + 13))
    shifted = probe.call(torch.cat([front, x], dim=1)).weights
    if shifted is None:
        return False
    tail = shifted[..., SHIFT:, SHIFT:].double()  # (B, H, L, L): the text's queries and keys, shifted
    where = allowed_here(L, probe.causal).expand_as(tail)
    a, b = centred(tail.clamp(min=1e-300).log(), where), centred(weights.double().clamp(min=1e-300).log(), where)
    return change(a, b) < POSITION_MATCH


def change(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return math.inf
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-12))


# ---- the families' contracts: what each family judges its own way -------------------------------------------------


@dataclass(frozen=True)
class FamilyUnit:
    """One family of attention as a unit: which layers belong to it (read from the layer's kind or from its identity,
    found by probing) and its contract, the checks it judges its own way by name (monitor/layer_contract.py's CHECKS).
    A judge returns None where the check's own judge is to say why it cannot judge (projections not found)."""

    name: str
    belongs: Callable[[Probe], bool]
    contract: dict[str, Callable[[Probe], Outcome | None]]


def by_family(name: str, judge: Callable[[Probe], Outcome]) -> Callable[[Probe], Outcome]:
    """The check `name` as a layer's family judges it: the first family of FAMILIES the layer belongs to whose
    contract names the check, else `judge`, the position-free, unmasked family's."""
    def judged(probe: Probe) -> Outcome:
        for family in FAMILIES:
            if name in family.contract and family.belongs(probe):
                outcome = family.contract[name](probe)
                if outcome is not None:
                    return outcome
                break
        return judge(probe)

    return judged


def order_by_definition(probe: Probe) -> Outcome:
    return Outcome("NOTE", "this kind's keys depend on where the tokens are (a window or a look-ahead): order "
                   "matters by its definition")


def positions_order(probe: Probe) -> Outcome:
    return Outcome("NOTE", f"not applied: order matters by this family's positions ({find_family(probe).positions}); "
                   "the permutation check is for position-free layers")


def positions_scale(probe: Probe) -> Outcome | None:
    if not probe.projections:
        return None
    return Outcome("NOTE", "not judged: the scores hold this family's position terms (see formula)")


def causal_permutation(probe: Probe) -> Outcome:
    """The causal counterpart of the permutation check: the last token sees the tokens before it as a set."""
    B, L, _ = probe.x.shape
    plain = probe.call(probe.x).out
    order = torch.cat([torch.randperm(L - 1, generator=probe.generator), torch.tensor([L - 1])])
    moved = changed(probe.call(probe.x[:, order]).out[:, -1], plain[:, -1])
    return Outcome("FAIL" if not moved < INVARIANCE else "PASS", f"causal: the last token's output moves by "
                   f"{rounding(moved)} when the tokens before it are permuted", {"output_moved": moved})


def causal_look_ahead(probe: Probe) -> Outcome:
    """Every real query sees itself, and no earlier output moves when later tokens change."""
    parts, figures, bad, _ = sees_itself(probe)
    x = probe.x.clone()
    x[:, -2:] = torch.randn(x[:, -2:].shape, generator=probe.generator)
    moved = changed(probe.call(x).out[:, :-2], probe.call(probe.x).out[:, :-2])
    figures["earlier_moved"] = moved
    parts.insert(0, f"causal: earlier outputs move by {rounding(moved)} when the last 2 tokens change")
    if not moved < INVARIANCE:
        bad.append(f"an earlier output moves by {figure(moved)} when later tokens change")
    return Outcome("FAIL" if bad else "PASS", "; ".join(bad or parts), figures)


def position_formula(probe: Probe) -> Outcome | None:
    """A family with position terms: its scores depart from Q Kᵀ/√d_k as the family allows (found by probing); the
    output must still be W_O (weights · V) with the weights it used and V from what its projections read."""
    if not probe.projections or probe.base.raw_out is None:
        return None
    family = find_family(probe)
    seen, real = probe.base, probe.real()
    layout = probe.projections[0]
    if seen.weights is None or seen.weights.shape[1] != layout.heads:
        return Outcome("NOTE", f"positions {family.positions}: the output could not be recomputed (no weights of "
                       f"{layout.heads} head(s) seen)")
    v = split_heads(project(seen.x.double(), layout.v), layout.heads)
    heads = merge_heads(seen.weights.double() @ v)  # (B, L, H·d)
    expected = project(heads, layout.o) if layout.o is not None else heads
    if seen.raw_out is None or seen.raw_out.shape != expected.shape:
        return Outcome("NOTE", f"positions {family.positions}: the output is not compared (no W_O found by name, or "
                       "another shape)", fix="name it: diagnose.py --attention … --map q=ATTR,k=ATTR,v=ATTR,o=ATTR")
    candidates = {"W_O left out": heads[real]} if layout.o is not None else {}
    difference, how = differ(seen.raw_out.double()[real], expected[real], candidates)
    terms = {"bias": "an additive bias that does not depend on the content", "relative": "a shift-invariant "
             "(relative) term"}[family.positions]
    if not how:
        return Outcome("PASS", f"the scores depart from Q Kᵀ/√d_k by {terms}, as this family's positions do; the "
                       f"output is W_O (weights · V) from {layout.describe()} (largest difference "
                       f"{rounding(difference)})", {"difference": difference})
    return Outcome("FAIL", f"output differs by {figure(difference)} from W_O (weights · V) with the weights it used: "
                   f"{how} ({layout.describe()})", {"difference": difference}, fix=OUTPUT_FIX)


FAMILIES: list[FamilyUnit] = [  # the first a layer belongs to judges the checks its contract names
    FamilyUnit("keys by position", lambda probe: probe.layer.keys_by_position,  # a window, the look-ahead mask
               {"permutation": order_by_definition}),
    FamilyUnit("position terms", lambda probe: find_family(probe).position_terms,  # a content-free bias, relative
               {"formula": position_formula, "scale": positions_scale, "permutation": positions_order}),
    FamilyUnit("causal", lambda probe: probe.causal, {"permutation": causal_permutation,
                                                      "look-ahead": causal_look_ahead}),
]
