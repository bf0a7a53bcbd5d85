# Multi-head attention after the Annotated Transformer's attention() (scores, masked_fill(mask == 0, -1e9), softmax),
# written inline with W_Q, W_K, W_V, W_O Linears; mask (batch, seq_len) bool, True for real tokens.
import math

import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.1):
        super().__init__()
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.W_Q = nn.Linear(d_model, d_model)
        self.W_K = nn.Linear(d_model, d_model)
        self.W_V = nn.Linear(d_model, d_model)
        self.W_O = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, mask=None):
        B, L, _ = x.shape
        Q = self.W_Q(x).view(B, L, self.n_heads, self.d_k).transpose(1, 2)
        K = self.W_K(x).view(B, L, self.n_heads, self.d_k).transpose(1, 2)
        V = self.W_V(x).view(B, L, self.n_heads, self.d_k).transpose(1, 2)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            scores.masked_fill(mask[:, None, None, :] == 0, -1e9)
        p_attn = self.dropout(scores.softmax(dim=-1))
        out = torch.matmul(p_attn, V).transpose(1, 2).contiguous().view(B, L, -1)
        return self.W_O(out), p_attn
