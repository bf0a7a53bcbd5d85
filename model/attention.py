"""Multi-head self-attention written out as matrices, the way the textbook formula reads.

    Q = X W_Q    K = X W_K    V = X W_V
    A = softmax(Q Kᵀ / √d)          each row sums to 1; padded keys get exactly 0
    out = concat_heads(A V) W_O

Letters in the shape comments: B batch, L tokens, H heads, d head size, D model width.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadSelfAttention(nn.Module):
    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        d_head: int | None = None,
        dropout: float = 0.0,
        bias: bool = False,
        scale: float | None = None,
    ):
        super().__init__()
        d_head = d_head or d_model // n_heads
        if d_head < 1:
            raise ValueError(f"d_head must be >= 1, got d_model={d_model}, n_heads={n_heads}")
        self.n_heads, self.d_head = n_heads, d_head
        # 1/√d keeps the dot products at unit variance whatever the head size; a float overrides it
        # (scale=1.0 reproduces "no scaling", which saturates the softmax for large d).
        self.scale = 1.0 / math.sqrt(d_head) if scale is None else float(scale)
        inner = n_heads * d_head
        self.w_q = nn.Linear(d_model, inner, bias=bias)
        self.w_k = nn.Linear(d_model, inner, bias=bias)
        self.w_v = nn.Linear(d_model, inner, bias=bias)
        self.w_o = nn.Linear(inner, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        x: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        causal: bool = False,
        need_weights: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (B, L, D); key_padding_mask (B, L) bool, True marks padding. Returns (out (B, L, D), weights (B, H, L, L) or None)."""
        B, L, _ = x.shape
        q = self.split_heads(self.w_q(x))  # (B, H, L, d)
        k = self.split_heads(self.w_k(x))  # (B, H, L, d)
        v = self.split_heads(self.w_v(x))  # (B, H, L, d)
        blocked = attention_mask(key_padding_mask, causal, L, x.device)  # (B or 1, 1, L, L), True = no attention

        if not need_weights:
            # Same numbers through PyTorch's fused kernel (tests/test_attention.py proves them equal);
            # the explicit path below is the reference and the one that can hand out the weights.
            out = fused_attention(q, k, v, blocked, self.scale, self.dropout.p if self.training else 0.0)
            return self.w_o(self.merge_heads(out)), None

        scores = (q @ k.transpose(-2, -1)) * self.scale  # (B, H, L, L)
        if blocked is not None:
            # The most negative finite number, not -inf: exp() of it is exactly 0, and a row whose keys are
            # all padding becomes uniform instead of NaN; that row is zeroed just below.
            scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=-1)  # (B, H, L, L), each row sums to 1
        if blocked is not None:
            weights = weights.masked_fill(blocked, 0.0)  # exact zeros, also for all-padding rows
        out = self.dropout(weights) @ v  # (B, H, L, d)
        return self.w_o(self.merge_heads(out)), weights

    def forward_packed(self, x: torch.Tensor, key_padding_mask: torch.Tensor, causal: bool = False) -> torch.Tensor:
        """The fused path on real tokens only, for callers that keep padding out: x (N, D) holds the N real tokens
        of a (B, L) batch in row-major order, key_padding_mask (B, L) marks padding. Returns (N, D).

        Projections skip the padding; only the attention core sees the (B, L) grid, with zeros at padded places.
        Equal to forward() at the real tokens, outputs and gradients (tests/test_attention.py).
        """
        B, L = key_padding_mask.shape
        real = ~key_padding_mask.bool()  # (B, L)
        # One scatter onto the grid for q, k and v together: on a CPU, writing the padded grid costs more than
        # the projections do.
        qkv = unpack(torch.cat([self.w_q(x), self.w_k(x), self.w_v(x)], dim=-1), real)  # (B, L, 3·H·d)
        q, k, v = qkv.view(B, L, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)  # each (B, H, L, d)
        blocked = attention_mask(key_padding_mask, causal, L, x.device)  # (B, 1, L, L) or (B, 1, 1, L)
        out = fused_attention(q, k, v, blocked, self.scale, self.dropout.p if self.training else 0.0)  # (B, H, L, d)
        return self.w_o(out.transpose(1, 2)[real].flatten(1))  # (N, H·d) → (N, D)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        B, L, _ = t.shape
        return t.view(B, L, self.n_heads, self.d_head).transpose(1, 2)  # (B, H, L, d)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        B, H, L, d = t.shape
        return t.transpose(1, 2).reshape(B, L, H * d)  # (B, L, H·d)


def attention_mask(
    key_padding_mask: torch.Tensor | None, causal: bool, L: int, device: torch.device
) -> torch.Tensor | None:
    """Boolean (B or 1, 1, L, L) mask, True where a query may not look at a key; None when nothing is masked."""
    blocked = None
    if key_padding_mask is not None:
        blocked = key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, L): padded keys, for every query
    if causal:
        future = torch.ones(L, L, dtype=torch.bool, device=device).triu(diagonal=1)  # (L, L): keys after the query
        blocked = future[None, None] if blocked is None else blocked | future
    return blocked


def unpack(t: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(N, C) real tokens → (B, L, C) with zeros at padding; real (B, L) bool marks the N real places."""
    grid = t.new_zeros(*real.shape, t.shape[-1])
    grid[real] = t
    return grid


def fused_attention(q, k, v, blocked, scale: float, dropout_p: float) -> torch.Tensor:
    """softmax(q kᵀ · scale) v through F.scaled_dot_product_attention, with the reference path's conventions."""
    if blocked is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    # An additive float mask (not a boolean one) keeps all-padding rows finite, as in the reference path.
    bias = torch.zeros(blocked.shape, dtype=q.dtype, device=q.device).masked_fill(blocked, torch.finfo(q.dtype).min)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    empty_rows = blocked.all(dim=-1, keepdim=True)  # (B, 1, L, 1): queries with no key to look at
    return out.masked_fill(empty_rows, 0.0)
