# Single-head self-attention as a course's closing example writes it ("self-attention in 20 lines"):
# Q = X W_Q, K = X W_K, V = X W_V, no mask, returns (output, attention weights); output width is d_k.
import math

import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k):
        super().__init__()
        self.d_k = d_k
        self.W_Q = nn.Linear(d_model, d_k, bias=False)
        self.W_K = nn.Linear(d_model, d_k, bias=False)
        self.W_V = nn.Linear(d_model, d_k, bias=False)

    def forward(self, X):
        # X: (batch, seq_len, d_model)
        Q = self.W_Q(X)  # (batch, seq_len, d_k)
        K = self.W_K(X)
        V = self.W_V(X)
        scores = Q @ K.transpose(1, 2) / math.sqrt(self.d_k)  # (batch, seq_len, seq_len)
        attn_weights = torch.softmax(scores, dim=-1)
        output = attn_weights @ V  # (batch, seq_len, d_k)
        return output, attn_weights
