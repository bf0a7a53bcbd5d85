# "Self-attention from scratch" as numpy tutorials write it: weight matrices used as x @ W, the softmax spelled out
# as exp / sum after subtracting the row maximum, then the 1/√d_k scaling; no mask.
import math

import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k):
        super().__init__()
        self.d_k = d_k
        self.W_q = nn.Parameter(torch.randn(d_model, d_k) / math.sqrt(d_model))
        self.W_k = nn.Parameter(torch.randn(d_model, d_k) / math.sqrt(d_model))
        self.W_v = nn.Parameter(torch.randn(d_model, d_k) / math.sqrt(d_model))

    def forward(self, x):
        q, k, v = x @ self.W_q, x @ self.W_k, x @ self.W_v
        scores = q @ k.transpose(-2, -1)
        e = torch.exp(scores - scores.max(dim=-1, keepdim=True).values)
        weights = e / e.sum(dim=-1, keepdim=True) / math.sqrt(self.d_k)
        return weights @ v, weights
