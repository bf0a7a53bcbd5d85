# Hand-written multi-head self-attention (w_q, w_k, w_v, w_o Linears) returning its attention map for plotting;
# key_padding_mask (B, L) bool, True where the token is padding.
import math

import torch
import torch.nn as nn


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, x, key_padding_mask=None):
        B, L, D = x.shape
        q = self.w_q(x).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.w_k(x).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.w_v(x).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        attn = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if key_padding_mask is not None:
            attn = attn.masked_fill(key_padding_mask[:, None, None, :], -1e9)
        out = torch.matmul(torch.softmax(attn, dim=-1), v)
        out = out.transpose(1, 2).reshape(B, L, D)
        return self.w_o(out), attn
