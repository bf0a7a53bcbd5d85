"""What the layer contract's checks (monitor/layer_contract.py) are made of: each one the doctor's `Check`
(monitor/units.py: one type for every check) made by `layer_check` from a judge of a `Probe`, carrying its verdicts;
the `Outcome` a judge gives, the `Row` the table prints, and the `Probe` it runs on: the layer, the module inside it
whose code computes the attention, and a seeded batch a classifier really gives (unit-variance token vectors, texts
of different lengths padded to the longest, every text with a real token).

The layer is called as the classifier calls every attention layer (model/kind.py): forward(x (B, L, D),
key_padding_mask (B, L) bool True = padding, need_weights) → (out (B, L, D), AttentionWeights or None); a user's own
class goes through model/own_attention/layer.py's adapter, whose `.inner` is the user's module.
"""

import math
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch
from torch import nn

from model.attention import AttentionWeights
from monitor.doctor import Finding, Verdict
from monitor.layer_formula import find_projections
from monitor.units import Check, Subject

LENGTHS = (7, 5, 2)  # the probe batch's texts, padded to the longest: each has a real token, two have padding
MORE_PADDING = 3  # padded tokens added to the batch by the padding check


class Unusable(Exception):
    """The layer cannot be called on the probe batch: the shapes check FAILs with why, the others are not run."""


class Outcome(NamedTuple):
    verdict: str  # PASS, FAIL or NOTE
    evidence: str  # the figures behind it, in words
    figures: dict = {}
    cause: str | None = None  # when the check's own cause or fix does not say it (the formula's stage)
    fix: str | None = None


@dataclass(frozen=True)
class Row:
    """One check's answer on one layer: what the table prints and the doctor's registry can take."""

    check: str  # the check's name
    verdict: str  # PASS, FAIL or NOTE
    evidence: str  # the figures behind the verdict, in words
    figures: dict  # the same figures, as numbers
    reads: str  # what the check reads
    rule: str  # when it FAILs
    cause: str  # the likely cause of a FAIL
    fix: str  # what to try


NOTE = "attention-note"  # the verdict of every layer check's NOTE
LAYER_NOTE = Verdict("note", "a layer check could not judge fully (no mask taken, projections not found by name, "
                     "computed in lower precision inside)", "the class leaves out what the check reads: it takes no "
                     "mask, names its projections otherwise, or computes in lower precision inside",
                     "name the projections with --map q=…,k=…,v=…,o=…; give forward a mask argument; or nothing, "
                     "where the NOTE says the layer is right as it is used")


def layer_check(name: str, judge: Callable[["Probe"], Outcome], reads: str, rule: str, cause: str,
                fix: str) -> Check:
    """A check of one layer alone (diagnose.py --attention) as a unit of the doctor's registry (monitor/units.py):
    judge(probe) → Outcome on the subject's layer (a Probe). It carries its verdicts: its FAIL is the warning
    attention-<name> (the rule, likely cause and what to try), its NOTE the shared attention-note. Its figures hold
    the Row the table prints."""
    failed = f"attention-{name}"

    def run(subject, measured: dict) -> tuple[dict, list[Finding]]:
        try:
            outcome = judge(subject.layer)
        except Unusable as e:
            outcome = Outcome("NOTE", f"not run: {e}")
        row = answer(check, outcome)
        found = {"FAIL": [Finding(failed, None, None, row.figures, row.evidence)],
                 "NOTE": [Finding(NOTE, None, None, row.figures, f"{name}: {row.evidence}")]}
        return {"row": row, **row.figures}, found.get(row.verdict, [])

    check = Check(name, ("layer",), run, {failed: Verdict("warning", f"{name} FAILs when {rule}", cause, fix),
                                          NOTE: LAYER_NOTE}, summary=reads)
    return check


def answer(check: Check, outcome: Outcome) -> Row:
    """A layer check's Row for an outcome: its cause and fix those of its FAIL verdict unless the outcome says."""
    verdict = check.verdicts[f"attention-{check.name}"]
    return Row(check.name, outcome.verdict, outcome.evidence, dict(outcome.figures), check.summary, verdict.rule,
               outcome.cause or verdict.cause, outcome.fix or verdict.fix)


def judged(check: Check, probe: "Probe") -> Row:
    """A layer check's Row on one probe, outside the registry's runner (a check run on request)."""
    return check.run(Subject(layer=probe), {})[0]["row"]


@dataclass
class Seen:
    """One call of the layer: what it handed out, and what the user's module inside it received and returned."""

    out: torch.Tensor  # the layer's output (B, L, D)
    weights: torch.Tensor | None  # the handed-out weights, token × token (B, H, L, L); None if none
    x: torch.Tensor | None = None  # what its projections read (B, L, D): its input, after any norm inside
    raw_out: torch.Tensor | None = None  # its own output (B, L, ·), before any projection the adapter adds
    raw_weights: torch.Tensor | None = None  # its own weights as returned: (B, L, L) or (B, H, L, L)
    heads: torch.Tensor | None = None  # the input of its output projection (the heads' output), when found
    o_out: torch.Tensor | None = None  # what its output projection gave, before anything the class adds after it


@dataclass
class Probe:
    """The layer under test and the seeded inputs every check reads."""

    layer: nn.Module
    mapping: dict | None = None
    seed: int = 0
    spec: object = None  # what the layer was built from ("file.py:Class" trains by name: the learn check)
    args: dict | None = None  # its constructor arguments beyond the sizes
    max_length: int = 128  # the longest text it will read (the long-input check; the others read LENGTHS)
    cache: dict = field(default_factory=dict)

    def __post_init__(self):
        self.user = self.layer.inner  # the module whose code computes the attention (model/kind.py)
        self.d_model = model_width(self.layer)
        # A causal class needs no mask: padding at the end of a text is after every real token.
        self.causal = bool(self.layer.causal)
        self.takes_mask = self.layer.takes_mask or self.causal
        generator = torch.Generator().manual_seed(self.seed)
        lengths = torch.tensor(LENGTHS if self.takes_mask else (max(LENGTHS),) * len(LENGTHS))
        L = int(lengths.max())
        self.x = torch.randn(len(lengths), L, self.d_model, generator=generator)  # (B, L, D), unit variance
        self.padding = torch.arange(L) >= lengths[:, None]  # (B, L) True = padding
        self.other = torch.randn(len(lengths), L + MORE_PADDING, self.d_model, generator=generator)
        self.generator = generator

    def call(self, x, padding=None, *, train=False, grad=False) -> Seen:
        """The layer on x (B, L, D) and its padding (None: no padding), in eval (or train) mode."""
        mask = padding if self.takes_mask and padding is not None and padding.any() else None
        record = {"inputs": [], "output": [], "heads": [], "read": [], "o_out": []}  # each call of each module
        hooks = []

        def keep(name, value):
            record[name].append(value)

        if self.user is not self.layer:
            hooks.append(self.user.register_forward_hook(
                lambda module, args, kwargs, output: keep("inputs", (args, kwargs)) or keep("output", output),
                with_kwargs=True))
        o_module = self.projections[0].o_module if self.projections else None
        in_module = self.projections[0].in_module if self.projections else None
        if o_module is not None:
            hooks.append(o_module.register_forward_pre_hook(lambda module, args: keep("heads", args[0])))
        # What W_O gives, copied before the class changes it in place (q += residual); nn.MultiheadAttention applies
        # its out_proj inside its own forward, whose output is then W_O's.
        last = in_module if isinstance(in_module, nn.MultiheadAttention) else o_module
        if last is not None:
            hooks.append(last.register_forward_hook(
                lambda module, args, output: keep("o_out", (output[0] if isinstance(output, tuple) else output).clone())))
        if in_module is not None and self.user is not self.layer:
            hooks.append(in_module.register_forward_pre_hook(
                lambda module, args, kwargs: keep("read", (*args, *kwargs.values())[0]), with_kwargs=True))
        was_training = self.layer.training
        self.layer.train(train)
        try:
            with torch.set_grad_enabled(grad):
                out, handed = self.layer(x, key_padding_mask=mask, need_weights=True)
        except Exception as e:  # a user's layer may raise anything: the shapes check names it
            raise Unusable(f"the layer raised {type(e).__name__}: {e}".splitlines()[0]) from e
        finally:
            self.layer.train(was_training)
            for hook in hooks:
                hook.remove()
        weights = token_by_token(handed, x.shape[1])
        seen = Seen(out, weights, x, out, weights, first(record["heads"]))
        seen.o_out = first(record["o_out"])
        if record["output"]:
            inputs = [next((t for t in (*args, *kwargs.values()) if torch.is_tensor(t)), None)
                      for args, kwargs in record["inputs"]]
            seen.x = first(inputs) if torch.is_tensor(first(inputs)) and first(inputs).ndim == 3 else x
            read = first(record["read"])
            if torch.is_tensor(read) and read.shape == seen.x.shape:
                seen.x = read
            outputs = [split_output(output) for output in record["output"]]
            seen.raw_out, seen.raw_weights = first([o for o, _ in outputs]), first([w for _, w in outputs])
        return seen

    @property
    def base(self) -> Seen:
        """The layer on the probe batch (cached)."""
        if "base" not in self.cache:
            try:
                self.cache["base"] = self.call(self.x, self.padding)
            except Unusable as e:
                self.cache["base"] = e
        if isinstance(self.cache["base"], Unusable):
            raise Unusable("the layer could not be called on the probe batch (see shapes)")
        return self.cache["base"]

    @property
    def projections(self):
        if "projections" not in self.cache:
            heads = getattr(self.layer, "n_heads", None)
            self.cache["projections"] = find_projections(self.user, self.d_model, heads, self.mapping)
        return self.cache["projections"]

    def real(self, padding=None) -> torch.Tensor:
        return ~(self.padding if padding is None else padding)


def first(values: list):
    """What one call of a module gave: the first, or (a class run one text at a time, model/own_attention/mask_probe.py)
    each text's (L, ·) stacked into (B, L, ·); None when it was not called."""
    if not values:
        return None
    if len(values) > 1 and all(torch.is_tensor(v) and v.ndim == 2 and v.shape == values[0].shape for v in values):
        return torch.stack(values)
    return values[0]


def model_width(layer: nn.Module) -> int:
    """D, the width of the token vectors the layer takes: its d_model, or the first projection's input."""
    for name in ("d_model", "embed_dim", "hidden_size", "dim"):
        value = getattr(layer, name, None)
        if isinstance(value, int) and value > 0:
            return value
    first = next((m for m in layer.modules() if isinstance(m, (nn.Linear, nn.MultiheadAttention))), None)
    if first is None:
        raise ValueError(f"{type(layer).__name__}: cannot tell its model width (no d_model attribute, no nn.Linear)")
    return first.in_features if isinstance(first, nn.Linear) else first.embed_dim


def split_output(output):
    """The user's output → (out, weights or None): a tensor, or a tuple (out, weights, …)."""
    if torch.is_tensor(output):
        return output, None
    if isinstance(output, (tuple, list)) and output and torch.is_tensor(output[0]):
        weights = output[1] if len(output) > 1 else None
        if isinstance(weights, AttentionWeights):
            weights = weights.weights
        return output[0], weights if torch.is_tensor(weights) else None
    return None, None


def token_by_token(handed: AttentionWeights | None, L: int) -> torch.Tensor | None:
    """The handed-out weights as (B, H, L, L), query × token; None when none were handed out or its keys are not
    tokens (linformer's projected keys)."""
    if handed is None:
        return None
    if handed.key_positions is None and handed.global_rows is None:
        weights = handed.weights
    else:
        from monitor.views import token_window

        weights = token_window(handed, 0, L)
    return weights if weights.shape[-1] == L else None


def figure(value: float) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.3g}"


def rounding(value: float) -> str:
    """A difference that float32 rounding alone gives, whose digits vary by machine, as "< 1e-6"."""
    return "< 1e-6" if value < 1e-6 else figure(value)


def changed(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a − b| / max |b|: how far a token's output moved."""
    if a.shape != b.shape:
        return math.inf
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp(min=1e-12))
