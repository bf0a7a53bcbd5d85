"""The weights a user's class computes, seen while it runs (mask_probe.py, layer.py).

A class hands its weights out in one of four ways, tried in this order and named in the doctor's identity line:
    returned        forward returns (out, weights)
    an attribute    forward keeps them on self.attn, self.attn_weights, self.attention_weights, … (WEIGHT_ATTRIBUTES)
    a softmax seen  the last softmax of shape (B, [H,] L, L) it computes
    a fused call    it calls F.scaled_dot_product_attention or nn.MultiheadAttention, whose weights never leave the
                    kernel: while WeightsSeen is active such a call is answered by the written formula with the same
                    arguments (attn_mask, is_causal, scale; dropout off) and its weights kept. Outside those moments
                    (training steps that need no weights) the class runs its own fast path, untouched.

Letters in the shape comments: B batch, H heads, L queries, S keys, d head size.
"""

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from model.attention import attention

SOFTMAXES = (torch.softmax, torch.Tensor.softmax, F.softmax, torch.special.softmax)
WEIGHT_ATTRIBUTES = ("attn", "attn_weights", "attention_weights", "attention_probs", "attn_probs", "p_attn",
                     "attn_weight", "weights", "att", "attention_scores_softmax")
RETURNED, ATTRIBUTE, SOFTMAX, FUSED = "returned", "an attribute", "a softmax seen", "a fused call recomputed"
# torch's own functions, as its dispatch names them to a TorchFunctionMode (kept here: a caller may wrap F's names)
SDPA, MULTIHEAD = F.scaled_dot_product_attention, F.multi_head_attention_forward
MHA_SIGNATURE = inspect.signature(MULTIHEAD)


def sdpa_by_formula(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                    enable_gqa=False):
    """F.scaled_dot_product_attention's semantics through model/attention.py's attention(), dropout off: a bool
    attn_mask True = takes part, a float one added to the scores, is_causal the top-left lower triangle.
    Returns (out (…, L, d), weights (…, L, S))."""
    L, S = query.shape[-2], key.shape[-2]
    if enable_gqa and key.shape[-3] != query.shape[-3]:
        repeat = query.shape[-3] // key.shape[-3]
        key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    blocked = None
    if is_causal:
        blocked = torch.ones(L, S, dtype=torch.bool, device=query.device).tril().logical_not()  # (L, S)
    bias = None
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        blocked = ~attn_mask if blocked is None else blocked | ~attn_mask
    elif attn_mask is not None:
        bias = attn_mask
    if bias is not None:  # an additive float mask (a position bias, 0 / -inf): its -inf places are blocked keys
        never = torch.isneginf(bias)
        if bool(never.any()):
            blocked = never if blocked is None else blocked | never
            bias = bias.masked_fill(never, 0.0)
    out, seen = attention(query, key, value, blocked, scale=scale, need_weights=True, bias=bias)
    return out, seen.weights


class WeightsSeen(TorchFunctionMode):
    """Keeps the weights of the (B, [H,] L, L) attention a forward computes: the last softmax of that shape, or a
    fused call answered by the written formula (which then replaces the kernel's answer for this call)."""

    def __init__(self, batch: int, length: int):
        super().__init__()
        self.batch, self.length = batch, length
        self.weights, self.source = None, None

    def fits(self, t) -> bool:
        """(B, [H,] L, L); for one text (batch 1) also its (L, L)."""
        return (isinstance(t, torch.Tensor) and t.shape[-2:] == (self.length, self.length)
                and (t.dim() in (3, 4) and t.shape[0] == self.batch or t.dim() == 2 and self.batch == 1))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is SDPA:
            out, weights = sdpa_by_formula(*args, **kwargs)
            if self.fits(weights):
                self.weights, self.source = weights, FUSED
            return out
        if func is MULTIHEAD:
            return self.multihead(func, args, kwargs)
        out = func(*args, **kwargs)
        if func in SOFTMAXES and self.fits(out):
            self.weights, self.source = out, SOFTMAX
        return out

    def multihead(self, func, args, kwargs):
        """nn.MultiheadAttention's functional core asked for its per-head weights (its explicit softmax path),
        dropout off; answered as the caller asked (no weights, averaged, or per head)."""
        bound = MHA_SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        asked, average = bound.arguments["need_weights"], bound.arguments["average_attn_weights"]
        bound.arguments.update(need_weights=True, average_attn_weights=False, dropout_p=0.0)
        out, weights = func(*bound.args, **bound.kwargs)  # weights (B, H, L, S)
        if weights is not None and weights.shape[0] == self.batch and weights.shape[-2:] == (self.length,) * 2:
            self.weights, self.source = weights, FUSED
        if not asked:
            return out, None
        return out, weights.mean(dim=1) if average else weights


def attribute_weights(user: nn.Module, before: dict, batch: int, length: int):
    """Weights the forward left on an attribute of the class (or of one of its modules): a tensor of shape
    (B, [H,] L, L) that was not there, or was another object, before the call. None when none."""
    for path, module in user.named_modules():
        for name in WEIGHT_ATTRIBUTES:
            value = module.__dict__.get(name)
            key = f"{path}.{name}"
            if isinstance(value, torch.Tensor) and value is not before.get(key) and value.dim() in (3, 4) \
                    and value.shape[0] == batch and value.shape[-2:] == (length, length):
                return value
    return None


def attributes_now(user: nn.Module) -> dict:
    """The candidate weight attributes before a call, to tell a fresh one from a stale one after it."""
    return {f"{path}.{name}": module.__dict__.get(name) for path, module in user.named_modules()
            for name in WEIGHT_ATTRIBUTES if name in module.__dict__}
