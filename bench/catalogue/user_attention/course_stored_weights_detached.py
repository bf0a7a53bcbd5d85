# Single-head self-attention in the course's 20-line style (W_Q, W_K, W_V, no mask, output width d_k), keeping
# the last attention map on the module for plotting afterwards.
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
        self.attn_weights = None

    def forward(self, X):
        Q, K, V = self.W_Q(X), self.W_K(X), self.W_V(X)
        scores = Q @ K.transpose(-2, -1) / math.sqrt(self.d_k)
        self.attn_weights = torch.softmax(scores, dim=-1).detach()  # kept for the heatmap
        output = self.attn_weights @ V
        return output, self.attn_weights
