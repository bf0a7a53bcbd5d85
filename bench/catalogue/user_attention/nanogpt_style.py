# EDITED from nanoGPT's CausalSelfAttention (not a published class): causal mask and flash path removed, config
# replaced by (dim, heads), to fit a classifier before the product took classes as published; the unchanged
# original is published/nanogpt.py.
# nanoGPT's CausalSelfAttention without the causal mask (for a classifier), with dim / heads in place of
# n_embd / n_head: one c_attn Linear split in three, c_proj out; no mask; returns only the output, no weights.
import math

import torch.nn as nn
import torch.nn.functional as F


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, dropout=0.0):
        super().__init__()
        assert dim % heads == 0
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.attn_dropout = nn.Dropout(dropout)
        self.heads = heads
        self.dim = dim

    def forward(self, x):
        B, T, C = x.size()  # batch size, sequence length, embedding dimensionality (dim)
        q, k, v = self.c_attn(x).split(self.dim, dim=2)
        k = k.view(B, T, self.heads, C // self.heads).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        v = v.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)
