# Self-attention with a Hugging Face style attention_mask (batch, seq_len): 1 for tokens, 0 for padding, made into
# an additive -10000 mask; padded positions are zeroed in the output, as some BERT re-implementations do.
import math

import torch
import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.o_proj = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        bsz, seq_len, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            extended_attention_mask = attention_mask[:, None, None, :].to(scores.dtype) * -10000.0
            scores = scores + extended_attention_mask
        probs = scores.softmax(dim=-1)
        context = torch.matmul(probs, v).transpose(1, 2).reshape(bsz, seq_len, -1)
        context = self.o_proj(context)
        if attention_mask is not None:
            context = context * attention_mask[:, :, None].to(context.dtype)
        return context, probs
