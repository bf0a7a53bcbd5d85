# EDITED from the Annotated Transformer's MultiHeadedAttention (not a published class): forward(x, mask) in place of
# forward(query, key, value, mask=None), mask required, clones() inlined, to fit the product before it took classes as
# published; the unchanged original is published/annotated_transformer.py.
# The Annotated Transformer's MultiHeadedAttention (h, d_model, four Linears in a ModuleList, a module-level
# attention()), used as self-attention; mask (batch, seq_len, seq_len) bool, True where the query may see the key.
import math

import torch
import torch.nn as nn


def attention(query, key, value, mask=None, dropout=None):
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        assert d_model % h == 0
        self.d_k = d_model // h
        self.h = h
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])  # W_Q, W_K, W_V, W_O
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x, mask):
        mask = mask.unsqueeze(1)  # same mask for every head
        nbatches = x.size(0)
        query, key, value = [
            lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2) for lin in self.linears[:3]
        ]
        out, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)
        out = out.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        return self.linears[-1](out), self.attn
