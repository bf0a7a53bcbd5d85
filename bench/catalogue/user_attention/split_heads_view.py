# Hand-written multi-head self-attention with torch's key_padding_mask (B, L) bool, True where the token is
# padding; heads made with one view call, as in short "multi-head attention explained" posts.
import math

import torch.nn as nn


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, x, key_padding_mask=None):
        B, L, D = x.shape
        q = self.w_q(x).view(B, self.n_heads, L, self.d_k)  # (B, H, L, d_k)
        k = self.w_k(x).view(B, self.n_heads, L, self.d_k)
        v = self.w_v(x).view(B, self.n_heads, L, self.d_k)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        attn = scores.softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).contiguous().view(B, L, D)
        return self.w_o(out), attn
