# torch's nn.MultiheadAttention wrapped as self-attention (the PyTorch-forum answer), handing out its per-head
# weights; key_padding_mask (B, L) bool, True where the token is padding (torch's own convention).
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, dropout=0.0):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim, num_heads, dropout=dropout, batch_first=True)

    def forward(self, x, key_padding_mask=None):
        out, weights = self.attn(
            x, x, x, key_padding_mask=key_padding_mask, need_weights=True, average_attn_weights=False
        )
        return out, weights  # (B, L, E), (B, heads, L, L)
