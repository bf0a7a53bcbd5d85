"""The doctor's reference: a kind's definition recomputed the plainest way, dense and in float64, from the layer's
own weights, for the contract to compare with what the layer computed (monitor/contract.py) and for the formula
check of a user's class (monitor/layer_formula.py). What a query sees is the kind's to say
(`reference_keys_values`, next to the kind in model/attention.py and model/long_attention.py); the arithmetic is
torch's own multi-head attention, independent of attention()."""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F


def reference(layer, x: torch.Tensor, padding: torch.Tensor, *, scale: float, causal: bool) -> "Reference":
    """The layer's definition recomputed: x (B, L, D) the layer's input, padding (B, L) bool from the texts' lengths."""
    q, k, v = reference_projections(layer, x)
    keys, values, allowed = layer.reference_keys_values(k, v, padding, causal)
    return dense_reference(layer, q, keys, values, allowed, scale)


class Reference(NamedTuple):
    """A kind's definition recomputed densely (monitor/reference.py reference): every stage, over all L keys
    (linformer: its k projected keys), for the doctor to compare with what the layer handed out."""

    scores: torch.Tensor  # (B, H, L, K) q·k · scale; -inf where the definition blocks the key
    weights: torch.Tensor  # (B, H, L, K) softmax rows; 0 where blocked (and in rows with no key at all)
    allowed: torch.Tensor  # (B, 1, L, K) bool
    heads: torch.Tensor  # (B, L, H·d) the heads' outputs side by side, before W_O
    out: torch.Tensor  # (B, L, D)
    q: torch.Tensor  # (B, H, L, d), and the keys and values the queries see, (B, H, K, d)
    k: torch.Tensor
    v: torch.Tensor


def reference_projections(layer, x: torch.Tensor):
    """Q, K, V (B, H, L, d) each, float64, from the layer's W_Q, W_K, W_V (and biases) on x (B, L, D)."""
    B, L, _ = x.shape
    return [F.linear(x.double(), w.weight.double(), None if w.bias is None else w.bias.double())
            .view(B, L, layer.n_heads, layer.d_head).transpose(1, 2) for w in (layer.w_q, layer.w_k, layer.w_v)]


def dense_reference(layer, q, k, v, allowed: torch.Tensor, scale: float) -> Reference:
    """softmax(q kᵀ · scale) v over the allowed keys, by torch's own multi-head attention
    (F.multi_head_attention_forward with its weights asked for: its explicit path, never the fused kernel, which
    default training does not call) on the layer's projected q, k, v with identity projections, then the layer's
    W_O. The formula itself stays written once, in attention(); this reference is torch's, independent of it."""
    B, H, L, d = q.shape
    eye = torch.eye(H * d, dtype=q.dtype, device=q.device)
    query = (q * (scale * math.sqrt(d))).transpose(1, 2).reshape(B, L, H * d).transpose(0, 1)  # (L, B, H·d);
    # torch scales by 1/√d itself, so the layer's own scale is folded into the queries
    blocked = ~allowed.expand(B, H, L, k.shape[-2])
    empty = blocked.all(dim=-1, keepdim=True)  # (B, H, L, 1): a query with no key (torch gives NaN there)
    keys = query.new_zeros(k.shape[-2], B, H * d)  # stand-ins of the key length; static_k, static_v are the keys
    heads, weights = F.multi_head_attention_forward(
        query, keys, keys, H * d, H, None, None, None, None, False, 0.0, eye, torch.zeros(H * d, dtype=q.dtype,
        device=q.device), training=False, need_weights=True, attn_mask=blocked.reshape(B * H, L, -1),
        use_separate_proj_weight=True, q_proj_weight=eye, k_proj_weight=eye, v_proj_weight=eye,
        static_k=k.reshape(B * H, -1, d), static_v=v.reshape(B * H, -1, d), average_attn_weights=False)
    weights = weights.masked_fill(empty, 0.0)  # (B, H, L, K)
    heads = heads.transpose(0, 1).reshape(B, L, H, d).masked_fill(empty.transpose(1, 2), 0.0).flatten(2)  # (B, L, H·d)
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~allowed, -math.inf)  # the stage compared first
    w_o = layer.w_o
    out = F.linear(heads, w_o.weight.double(), None if w_o.bias is None else w_o.bias.double())
    return Reference(scores, weights, allowed, heads, out, q, k, v)
