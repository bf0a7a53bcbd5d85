# Single-head self-attention in the course's 20-line style (W_Q, W_K, W_V, no mask, returns output and
# attention weights, output width d_k).
import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k):
        super().__init__()
        self.W_Q = nn.Linear(d_model, d_k, bias=False)
        self.W_K = nn.Linear(d_model, d_k, bias=False)
        self.W_V = nn.Linear(d_model, d_k, bias=False)

    def forward(self, X):
        Q = self.W_Q(X)  # (batch, seq_len, d_k)
        K = self.W_K(X)
        V = self.W_V(X)
        scores = torch.bmm(Q, K.transpose(1, 2))  # (batch, seq_len, seq_len)
        attn_weights = torch.softmax(scores, dim=-1)
        output = torch.bmm(attn_weights, V)
        return output, attn_weights
