# Multi-head attention in einsum notation, one plain weight matrix per projection (the "attention with
# torch.einsum" blog-post style); mask (batch, seq_len) bool, True where the token is real.
import math

import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads, d_head):
        super().__init__()
        self.num_heads = num_heads
        self.d_head = d_head
        inner = num_heads * d_head
        self.w_q = nn.Parameter(torch.empty(d_model, inner))
        self.w_k = nn.Parameter(torch.empty(d_model, inner))
        self.w_v = nn.Parameter(torch.empty(d_model, inner))
        self.w_o = nn.Parameter(torch.empty(inner, d_model))
        for w in (self.w_q, self.w_k, self.w_v, self.w_o):
            nn.init.xavier_uniform_(w)

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        q = torch.einsum("bnd,de->bne", x, self.w_q).view(b, n, self.num_heads, self.d_head)
        k = torch.einsum("bnd,de->bne", x, self.w_k).view(b, n, self.num_heads, self.d_head)
        v = torch.einsum("bnd,de->bne", x, self.w_v).view(b, n, self.num_heads, self.d_head)
        scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(self.d_head)  # (b, h, n, n)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        attn = scores.softmax(dim=-1)
        out = torch.einsum("bhij,bjhd->bihd", attn, v).reshape(b, n, -1)
        return torch.einsum("bne,ed->bnd", out, self.w_o), attn
