# "Self-attention with trainable weights" in the from-scratch book style: W_query / W_key / W_value Linears,
# attn_scores -> attn_weights -> context_vec, d_in / d_out spelled d_model / d_k; no mask.
import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k, qkv_bias=False):
        super().__init__()
        self.W_query = nn.Linear(d_model, d_k, bias=qkv_bias)
        self.W_key = nn.Linear(d_model, d_k, bias=qkv_bias)
        self.W_value = nn.Linear(d_model, d_k, bias=qkv_bias)

    def forward(self, x):
        keys = self.W_key(x)
        queries = self.W_query(x)
        attn_scores = queries @ keys.transpose(1, 2)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        context_vec = attn_weights @ x
        return context_vec, attn_weights
