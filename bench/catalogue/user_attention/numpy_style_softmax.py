# "Self-attention from scratch" the way numpy tutorials write it: weight matrices used as x @ W, the softmax
# spelled out as exp / sum after subtracting the row maximum; optional mask (batch, seq_len), 1 = token, 0 = padding.
import math

import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k):
        super().__init__()
        self.d_k = d_k
        self.W_query = nn.Parameter(torch.randn(d_model, d_k) / math.sqrt(d_model))
        self.W_key = nn.Parameter(torch.randn(d_model, d_k) / math.sqrt(d_model))
        self.W_value = nn.Parameter(torch.randn(d_model, d_k) / math.sqrt(d_model))

    @staticmethod
    def softmax(z, axis=-1):
        z = z - z.max(axis, keepdim=True).values  # subtract the max so exp() cannot overflow
        e = torch.exp(z)
        return e / e.sum(axis, keepdim=True)

    def forward(self, x, mask=None):
        queries = x @ self.W_query  # (batch, seq_len, d_k)
        keys = x @ self.W_key
        values = x @ self.W_value
        scores = queries @ keys.transpose(-2, -1) / self.d_k**0.5  # (batch, seq_len, seq_len)
        if mask is not None:
            scores = torch.where(mask[:, None, :] == 0, torch.full_like(scores, -1e9), scores)
        weights = self.softmax(scores, axis=-1)
        context = weights @ values
        return context, weights
