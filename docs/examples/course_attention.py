"""Self-attention in the course's form: one head, matrices written out, no mask argument, output width d_k (not
d_model), returning (output, weights). The project's own class of that shape, which its tests and
docs/OWN_ATTENTION.md train and diagnose as a user's class."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k):
        """d_model: D, the width of each token's vector; d_k: the width of Q, K and V (here d_v = d_k)."""
        super().__init__()
        self.W_Q = nn.Linear(d_model, d_k, bias=False)  # D × d_k
        self.W_K = nn.Linear(d_model, d_k, bias=False)  # D × d_k
        self.W_V = nn.Linear(d_model, d_k, bias=False)  # D × d_v
        self.d_k = d_k

    def forward(self, X):
        """X (B, L, D) → output (B, L, d_k), attention weights (B, L, L)."""
        Q = self.W_Q(X)  # X W_Q  (B, L, d_k)
        K = self.W_K(X)  # X W_K  (B, L, d_k)
        V = self.W_V(X)  # X W_V  (B, L, d_k)
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)  # Q Kᵀ / √d_k  (B, L, L)
        weights = F.softmax(scores, dim=-1)  # each row sums to 1  (B, L, L)
        output = torch.matmul(weights, V)  # A V  (B, L, d_k)
        return output, weights
