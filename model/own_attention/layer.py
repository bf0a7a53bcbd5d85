"""OwnAttention: a user's class, unchanged, inside the adapter that gives it the interface of the built-in layers
(model/kind.py's Kind): the kind model/kinds.py finds for "path/to/file.py:Class".

What the adapter finds out is found by running the class (mask_probe.py), never guessed from names: how its forward
takes a mask (positional or keyword, which convention, which shape), what it returns (out or (out, weights), weights
(B, L, L) or (B, H, L, L)), its output width (another than d_model gets an output projection the product adds, `w_o`)
and whether it is causal. A class that takes no mask is run on texts of one length at a time, so no key it sees is
padding, unless it is causal: padding at the end is then out of every real token's view already.

The class hands out its weights (returned, kept on an attribute, read from the softmax it computes, or a fused call
answered by the written formula while weights are asked for: weights_seen.py), not the scores it softmaxed:
AttentionWeights.scores is NaN (the monitor's score figures are then NaN, never a guess). A class whose weights
cannot be seen hands out none (need_weights gives None: no heatmaps, the output checks still run). The doctor's
formula reference is not defined for a user's class (`reference_keys_values` is None: monitor/contract.py skips it).

Letters in the shape comments: B batch, L tokens, H heads, D model width, W the class's output width, N real tokens.
"""

import logging
import math

import torch
from torch import nn

from model.attention import AttentionWeights, unpack
from model.errors import ConfigError
from model.kind import Kind
from model.own_attention.constructor import build_user_layer, constructor_arguments
from model.own_attention.mask_probe import Convention, find_convention, key_mask, run_layer, runs
from model.own_attention.naming import (
    check_attention_args, check_output_dtype, check_recorded, configured_class, display_name, is_class_spec,
    load_attention_class, long_input_problem, name_class, named_class,
)

log = logging.getLogger(__package__)  # the home's one logger, "model.own_attention"

# The attribute names tutorials give a layer's projections, lower case without "_" (normal()): the adapter finds
# the class's W_Q, W_K, W_V and W_O by them, and so does the doctor's formula check (monitor/layer_formula.py).
ROLE_NAMES = {
    "q": {"wq", "q", "qproj", "query", "queries", "toq", "qlinear", "linearq", "wquery", "queryproj", "projq",
          "qprojweight", "weightq", "wqs"},
    "k": {"wk", "k", "kproj", "key", "keys", "tok", "klinear", "lineark", "wkey", "keyproj", "projk", "kprojweight",
          "weightk", "wks"},
    "v": {"wv", "v", "vproj", "value", "values", "tov", "vlinear", "linearv", "wvalue", "valueproj", "projv",
          "vprojweight", "weightv", "wvs"},
    "o": {"wo", "o", "oproj", "out", "outproj", "toout", "output", "cproj", "proj", "outlinear", "linearo", "wout",
          "projout", "outputproj", "dense", "fcout", "fc"},
    "qkv": {"qkv", "toqkv", "cattn", "inproj", "inprojweight", "wqkv", "qkvproj", "qkvlinear", "projqkv"},
}


def normal(name: str) -> str:
    """An attribute path's last name, lower case without "_": W_Q, w_q and wq read alike."""
    return name.rsplit(".", 1)[-1].lower().replace("_", "")


def named_projection(user: nn.Module, role: str, kinds=nn.Linear):
    """The user's own submodule of one of `kinds` named like the role's projection (ROLE_NAMES), or None."""
    return next((m for n, m in user.named_children() if normal(n) in ROLE_NAMES[role] and isinstance(m, kinds)), None)


_said: set[str] = set()  # log lines already written (a network builds one adapter per layer)


def say_once(level: int, message: str) -> None:
    if message not in _said:
        _said.add(message)
        log.log(level, message)


class OwnAttention(Kind, nn.Module):
    """A user's attention class inside the classifier's Block, with the interface of the built-in layers
    (model/kind.py): forward(x (B, L, D), key_padding_mask (B, L) True = padding, need_weights) → (out (B, L, D),
    AttentionWeights or None), forward_packed, n_heads, head_gate, look_ahead, and the doctor's questions. `.user` is
    the user's module, unchanged; `.convention` says how it takes its mask (found by probing, mask_probe.py)."""

    summary = "a user's own class, path/to/file.py:ClassName (docs/OWN_ATTENTION.md)"
    names_code = True  # imported only when the user names it (naming.py); a checkpoint records its file's hash
    heads_cut = False  # its weights' layout per head is its own: its heads are measured, never cut (prune.py)
    gates_heads = True  # set per layer: whether head_gate can reach each head's contribution
    positions_inside = None  # found by probing (monitor/layer_family.py): none, a bias, a rotation, ...
    keys_by_position = False  # which keys a query sees is found by probing (its family), not defined beforehand

    @classmethod
    def names(cls, setting) -> bool:
        """Whether an `attention` setting names a user's class: "path/to/file.py:ClassName",
        "package.module:ClassName" or "package.module.ClassName" (a kind's name has no . or :)."""
        return is_class_spec(setting)

    @classmethod
    def source(cls, config) -> dict:
        """The user names the class in the config: found, hashed, recorded and trusted (naming.py's name_class); a
        checkpoint's record is data, checked for shape (building needs the class named)."""
        check_attention_args(config.attention_args)
        if config.attention_source is None:
            return name_class(config.attention)
        check_recorded(config.attention, config.attention_source)
        return config.attention_source

    @classmethod
    def build(cls, config, n_heads: int | None = None) -> "OwnAttention":
        """The class the user named for this config (configured_class: never one a checkpoint names) in the adapter."""
        return cls(configured_class(config), d_model=config.d_model, n_heads=n_heads or config.n_heads,
                   d_head=config.head_size, attention_args=config.attention_args, name=config.attention)

    @classmethod
    def order_blind(cls, config) -> bool:
        """Unknown for a user's class (it may hold positions of its own): the shuffled-tokens check is left out."""
        return False

    @classmethod
    def check(cls, config) -> None:
        """The class's constructor can be filled (when the user named the class: a checkpoint's record alone is
        data, checked when the network is built); the settings of the built-in formula, which do not reach a user's
        class, are refused rather than ignored."""
        named = named_class(config.attention_source)
        if named is not None:
            constructor_arguments(named, config.d_model, config.n_heads, config.head_size, config.attention_args)
        for name, default in (("scale", None), ("causal", False), ("attention_kernel", "manual"),
                              ("attention_dropout", 0.0), ("layer_heads", None)):
            if getattr(config, name) != default:
                raise ConfigError(f"{name} {getattr(config, name)!r} applies to the built-in attention kinds, not to "
                                  f"a user's class ({config.attention}): leave it unset (the class decides)")

    def __init__(self, cls_or_spec, *, d_model: int, n_heads: int, d_head: int | None = None,
                 attention_args: dict | None = None, name: str | None = None):
        super().__init__()
        cls = load_attention_class(cls_or_spec) if isinstance(cls_or_spec, str) else cls_or_spec
        name = name or (cls_or_spec if isinstance(cls_or_spec, str) else display_name(cls))
        self.user = build_user_layer(cls, d_model, n_heads, d_head or d_model // n_heads, attention_args, runs=runs)
        found = find_convention(self.user, d_model, name)
        self.convention: str = found.convention.describe()
        self.weights_not_used: Convention | None = found.weights_not_used  # the doctor names it (padding check)
        self.mask_convention: Convention = found.convention
        self.n_heads = found.heads  # the heads its weights show: (B, L, L) is one head
        self.width = found.width  # its output width W
        # A class that returns only its output: its weights are read as weights_seen.py says, when asked for.
        self.reads_softmax = not found.returns_weights
        self.weights_from: str | None = found.weights_from  # None: its weights cannot be seen
        self.d_model, self.d_head = d_model, d_head or d_model // n_heads
        # A user's class blocks what it blocks; the product adds no look-ahead mask, and says when it found one.
        self.causal = self.look_ahead = found.causal
        self.head_gate: torch.Tensor | None = None  # (H,): head importance and ablation (inference/heads.py)
        # An output width other than d_model gets the product's own W_O, so the residual can add it.
        self.w_o = nn.Linear(self.width, d_model, bias=False) if self.width != d_model else None
        if self.w_o is not None:
            say_once(logging.INFO, f"attention {name}: output width {self.width} ≠ d_model {d_model}: the product "
                                   f"adds an output projection nn.Linear({self.width}, {d_model}, bias=False)")
        if found.convention.call != "none" or not found.causal:
            say_once(logging.WARNING if found.convention.call == "none" else logging.INFO,
                     f"attention {name}: {self.convention}")
        if found.causal:
            say_once(logging.INFO, f"attention {name}: causal (no output depends on a later token, found by probing)"
                                   + (": padding at the end is out of every real token's view, so it needs no mask"
                                      if found.convention.call == "none" else ""))
        if self.reads_softmax:
            say_once(logging.INFO, f"attention {name}: forward returns no weights: " + (
                f"they are read from {found.weights_from}" if found.weights_from else
                "none can be seen (no attribute, softmax or fused call): no heatmaps, the output checks still run"))
        # Whether head_gate acts inside the class (on its output projection's input) or on its output.
        self._gate_inside = False
        self._gate_inside = self._find_gate()
        check_output_dtype(self, self.user, d_model, name)
        if not self.gates_heads:
            say_once(logging.INFO, f"attention {name}: its {self.n_heads} heads cannot be told apart in its output "
                                   "(no output projection by name): head ablation is left out for it")

    def _find_gate(self) -> bool:
        """Where head_gate acts (True: inside, on the input of the class's own output projection, whose H slices a
        hook multiplies): one head multiplies the whole output; several, the input of the class's output projection
        when it has one by name, else the output's H equal slices. Checked on a probe input: with every gate 0 the
        output must be the same at every token (only a bias left), else the layer refuses head ablation."""
        if self.n_heads == 1:
            return False
        projection = named_projection(self.user, "o", (nn.Linear, nn.Sequential))
        if isinstance(projection, nn.Sequential):
            projection = projection[0] if len(projection) and isinstance(projection[0], nn.Linear) else None
        if projection is not None and projection.in_features % self.n_heads == 0:
            projection.register_forward_pre_hook(self._gate_hook)  # a bound method: a deep copy gates its own
            self._gate_inside = True
        elif projection is not None or self.width % self.n_heads:
            self.gates_heads = False
            return False
        self.gates_heads = self._gate_works()
        return self._gate_inside

    def _gate_hook(self, module, args):
        return (self._gated(args[0]), *args[1:])

    def _gated(self, t: torch.Tensor) -> torch.Tensor:
        """t (..., H·d) with each head's d columns times its gate, when one is set."""
        if self.head_gate is None:
            return t
        return (t.unflatten(-1, (self.n_heads, -1)) * self.head_gate.view(self.n_heads, 1)).flatten(-2)

    @torch.no_grad()
    def _gate_works(self) -> bool:
        x = torch.randn(2, 5, self.d_model, generator=torch.Generator().manual_seed(0))
        was_training = self.training
        self.eval()
        try:
            self.head_gate = torch.zeros(self.n_heads)
            out, _ = self.forward(x)
            return bool(torch.allclose(out, out[:, :1].expand_as(out), atol=1e-5))
        except Exception:  # a gate the class's own shapes refuse: no head ablation for it
            return False
        finally:
            self.head_gate = None
            self.train(was_training)

    @property
    def takes_mask(self) -> bool:
        return self.mask_convention.call != "none"

    @property
    def runs_by_length(self) -> bool:
        """Whether the class takes no mask, so that a padded batch is run text length by text length."""
        return not self.takes_mask and not self.look_ahead

    @property
    def inner(self) -> nn.Module:
        return self.user

    def problem_at_length(self, length: int) -> str | None:
        """The class run on a text of `length` tokens (the doctor's probes read 7): an error it raises, or NaN."""
        return long_input_problem(self, self.d_model, length)

    def projection(self, role: str) -> nn.Linear | None:
        """The class's own nn.Linear for "w_q", "w_k" or "w_v" by its usual names (ROLE_NAMES), or None."""
        return named_projection(self.user, role[-1])

    # Read, not registered again: a second registration would make the monitor see one weight in two places.
    w_q = property(lambda self: self.projection("w_q"))
    w_k = property(lambda self: self.projection("w_k"))
    w_v = property(lambda self: self.projection("w_v"))

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = False
                ) -> tuple[torch.Tensor, AttentionWeights | None]:
        """x (B, L, D); key_padding_mask (B, L) bool, True marks padding. Returns (out (B, L, D), weights or None)."""
        B, L, _ = x.shape
        if self.head_gate is not None and not self.gates_heads:
            raise RuntimeError(f"head ablation: {type(self.user).__name__}'s heads cannot be told apart in its output "
                               "(no output projection found by name, e.g. out_proj / W_O): it has no per-head gate")
        if self.runs_by_length and key_padding_mask is not None and key_padding_mask.any():
            out, weights = self._by_length(x, key_padding_mask, need_weights)
        else:
            mask = None if self.mask_convention.call == "none" else key_mask(
                key_padding_mask if key_padding_mask is not None else x.new_zeros(B, L, dtype=torch.bool),
                self.mask_convention, x.dtype)
            out, weights = run_layer(self.user, x, mask, self.mask_convention, self.reads_softmax and need_weights)
        if not self._gate_inside:
            out = self._gated(out)  # (B, L, W), each head's slice times its gate
        if self.w_o is not None:
            out = self.w_o(out)  # (B, L, D)
        if not need_weights or weights is None:
            return out, None
        weights = weights if weights.dim() == 4 else weights.unsqueeze(1)  # (B, H, L, L)
        blocked = None if key_padding_mask is None else key_padding_mask.bool()[:, None, None, :]
        scores = weights.new_full((), math.nan).expand_as(weights)  # the class hands out no scores
        return out, AttentionWeights(weights, scores, blocked)

    def _by_length(self, x: torch.Tensor, key_padding_mask: torch.Tensor, need_weights: bool):
        """A class that takes no mask, run on the texts of each length apart at that length: no key it sees is
        padding. Returns (out (B, L, W), weights (B, H, L, L) zeros outside each text, or None)."""
        B, L, _ = x.shape
        lengths = (~key_padding_mask.bool()).sum(dim=-1)  # (B,)
        out, weights = None, None
        for length in lengths.unique().tolist():
            rows = (lengths == length).nonzero(as_tuple=True)[0]
            part, part_weights = run_layer(self.user, x[rows, :length], None, self.mask_convention,
                                           self.reads_softmax and need_weights)
            if out is None:  # the class's dtype (bfloat16 under autocast)
                out = part.new_zeros(B, L, self.width)
            out = out.index_put((rows,), nn.functional.pad(part, (0, 0, 0, L - length)))
            if part_weights is not None:
                part_weights = part_weights if part_weights.dim() == 4 else part_weights.unsqueeze(1)
                if weights is None:
                    weights = part_weights.new_zeros(B, part_weights.shape[1], L, L)
                weights = weights.index_put((rows,), nn.functional.pad(part_weights, (0, L - length, 0, L - length)))
        return out, weights

    def forward_packed(self, x: torch.Tensor, key_padding_mask: torch.Tensor, need_weights: bool = False
                       ) -> tuple[torch.Tensor, AttentionWeights | None]:
        """x (N, D) the real tokens of a (B, L) batch in row-major order → (out (N, D), weights or None): put on the
        (B, L) grid with zeros at padding, run as forward(), the real tokens taken back."""
        real = ~key_padding_mask.bool()  # (B, L)
        out, weights = self.forward(unpack(x, real), key_padding_mask, need_weights)
        return out[real.nonzero(as_tuple=True)], weights  # (N, D)

