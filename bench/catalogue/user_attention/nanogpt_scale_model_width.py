# One attention "Head" as the build-a-GPT-from-scratch video writes it (key/query/value Linears,
# wei = q @ kᵀ * C ** -0.5 with B, T, C = x.shape), without the causal tril, no mask; returns only the output.
import torch
import torch.nn as nn


class Head(nn.Module):
    def __init__(self, dim, head_size):
        super().__init__()
        self.key = nn.Linear(dim, head_size, bias=False)
        self.query = nn.Linear(dim, head_size, bias=False)
        self.value = nn.Linear(dim, head_size, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        k = self.key(x)  # (B, T, hs)
        q = self.query(x)  # (B, T, hs)
        wei = q @ k.transpose(-2, -1) * C**-0.5  # (B, T, hs) @ (B, hs, T) -> (B, T, T)
        wei = torch.softmax(wei, dim=-1)
        v = self.value(x)
        out = wei @ v  # (B, T, T) @ (B, T, hs) -> (B, T, hs)
        return out
