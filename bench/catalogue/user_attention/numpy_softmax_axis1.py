# Self-attention ported from a numpy notebook: x @ W matrices, softmax written out as exp / sum with the row
# maximum subtracted (axis=1, as in the 2-D notebook), no mask.
import numpy as np
import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k):
        super().__init__()
        self.d_k = d_k
        self.W_query = nn.Parameter(torch.randn(d_model, d_k) / np.sqrt(d_model))
        self.W_key = nn.Parameter(torch.randn(d_model, d_k) / np.sqrt(d_model))
        self.W_value = nn.Parameter(torch.randn(d_model, d_k) / np.sqrt(d_model))

    @staticmethod
    def softmax(z):
        z = z - z.max(axis=1, keepdims=True).values
        e = torch.exp(z)
        return e / e.sum(axis=1, keepdims=True)

    def forward(self, x):
        queries = x @ self.W_query
        keys = x @ self.W_key
        values = x @ self.W_value
        scores = queries @ keys.transpose(-2, -1) / np.sqrt(self.d_k)
        weights = self.softmax(scores)
        return weights @ values, weights
