# The output through F.scaled_dot_product_attention, the weights recomputed by hand only to plot them, as blog
# posts do when they add attention maps to an SDPA model; attn_mask (B, L) bool, True = may be attended.
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, d_model, n_heads, head_dim):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.q_proj = nn.Linear(d_model, n_heads * head_dim)
        self.k_proj = nn.Linear(d_model, n_heads * head_dim)
        self.v_proj = nn.Linear(d_model, n_heads * head_dim)
        self.out_proj = nn.Linear(n_heads * head_dim, d_model)

    def forward(self, x, attn_mask=None):
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, L, hd)
        k = self.k_proj(x).view(B, L, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, L, self.n_heads, self.head_dim).transpose(1, 2)
        mask = None if attn_mask is None else attn_mask[:, None, None, :]  # (B, 1, 1, L)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        # SDPA does not return its weights: recompute them for the heatmaps.
        with torch.no_grad():
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            weights = scores.softmax(dim=-1)

        out = out.transpose(1, 2).reshape(B, L, -1)
        return self.out_proj(out), weights
