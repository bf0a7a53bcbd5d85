# Attention in lucidrains' style (vit-pytorch, x-transformers): dim, heads, dim_head, one to_qkv Linear chunked in
# three, scale = dim_head ** -0.5; mask (b, n) bool, True = attend (his one convention everywhere).
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim, heads=8, dim_head=64, dropout=0.0):
        super().__init__()
        inner_dim = dim_head * heads
        self.heads = heads
        self.scale = dim_head**-0.5
        self.attend = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)
        self.to_qkv = nn.Linear(dim, inner_dim * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner_dim, dim), nn.Dropout(dropout))

    def forward(self, x, mask=None):
        b, n, _ = x.shape
        h = self.heads
        q, k, v = (t.reshape(b, n, h, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))

        dots = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        if mask is not None:
            dots = dots.masked_fill(~mask[:, None, None, :], -torch.finfo(dots.dtype).max)
        attn = self.attend(dots)
        attn = self.dropout(attn)

        out = torch.matmul(attn, v)
        out = out.transpose(1, 2).reshape(b, n, -1)
        return self.to_out(out), attn
