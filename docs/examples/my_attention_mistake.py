"""docs/examples/my_attention.py with one mistake planted, for docs/OWN_ATTENTION.md: the scores divided by d_k
instead of √d_k (the over-uniform attention of the seed's story)."""

import math

from torch import nn


class MyAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.W_Q = nn.Linear(d_model, d_model, bias=False)  # the heads' W_Q side by side: D × H·d_k
        self.W_K = nn.Linear(d_model, d_model, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)
        self.W_O = nn.Linear(d_model, d_model, bias=False)

    def forward(self, X, key_padding_mask=None):  # X (B, L, D); key_padding_mask (B, L), True = padding
        B, L, D = X.shape
        Q, K, V = (W(X).view(B, L, self.n_heads, self.d_k).transpose(1, 2) for W in (self.W_Q, self.W_K, self.W_V))
        scores = Q @ K.transpose(-2, -1) / self.d_k  # (B, H, L, L)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        weights = scores.softmax(dim=-1)  # (B, H, L, L), each row sums to 1
        out = (weights @ V).transpose(1, 2).reshape(B, L, D)  # the heads side by side again
        return self.W_O(out), weights
