# torch's nn.MultiheadAttention wrapped as self-attention, the way older tutorials build it; the input comes in
# as (batch, seq_len, embed_dim) like everywhere else in the model; no mask, weights averaged over heads for plotting.
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, dropout=0.0):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout)

    def forward(self, x):
        out, weights = self.attn(x, x, x, need_weights=True)
        return out, weights
