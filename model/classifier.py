"""The classifier network, plain PyTorch: embedding → N × attention block → pooling → linear head."""

import math
from typing import NamedTuple

import torch
from torch import nn

from model.attention import MultiHeadSelfAttention, unpack

POOLINGS = ("mean", "max", "first", "attention")
POSITIONS = ("learned", "sinusoidal", "none")


class ClassifierOutput(NamedTuple):
    logits: torch.Tensor  # (B, num_classes)
    attention: tuple[torch.Tensor, ...] | None  # one (B, H, L, L) per layer, when asked for


class Block(nn.Module):
    """Self-attention + residual + LayerNorm, then (optionally) a position-wise feed-forward the same way."""

    def __init__(self, *, d_model, n_heads, d_head, d_ff, dropout, attention_dropout, bias, scale):
        super().__init__()
        self.attention = MultiHeadSelfAttention(
            d_model=d_model, n_heads=n_heads, d_head=d_head, dropout=attention_dropout, bias=bias, scale=scale
        )
        self.norm1 = nn.LayerNorm(d_model)
        self.ffn = None
        if d_ff > 0:
            self.ffn = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model))
            self.norm2 = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, key_padding_mask, causal, need_weights, packed=False):
        """x (B, L, D), or (N, D) real tokens only when packed. Everything but attention is per token."""
        if packed:
            attended, weights = self.attention.forward_packed(x, key_padding_mask, causal=causal), None
        else:
            attended, weights = self.attention(x, key_padding_mask, causal=causal, need_weights=need_weights)
        x = self.norm1(x + self.dropout(attended))
        if self.ffn is not None:
            x = self.norm2(x + self.dropout(self.ffn(x)))
        return x, weights


class AttentionPooling(nn.Module):
    """A learned query scores every real token; the sentence vector is the softmax-weighted sum."""

    def __init__(self, d_model: int):
        super().__init__()
        self.score = nn.Linear(d_model, 1)

    def forward(self, x, key_padding_mask):
        scores = self.score(x).squeeze(-1)  # (B, L)
        if key_padding_mask is not None:
            scores = scores.masked_fill(key_padding_mask, torch.finfo(scores.dtype).min)
        weights = scores.softmax(dim=-1)  # (B, L)
        return (weights.unsqueeze(-1) * x).sum(dim=1)  # (B, D)


def position_embedding(kind: str, max_length: int, d_model: int) -> nn.Embedding:
    """Position vectors: learned, fixed sinusoids (Vaswani et al.; they give long sentences positions that
    short training phrases never reach a sensible value), or none (attention then sees a bag of tokens)."""
    if kind == "learned":
        return nn.Embedding(max_length, d_model)
    table = torch.zeros(max_length, d_model)
    if kind == "sinusoidal":
        position = torch.arange(max_length).unsqueeze(1)  # (max_length, 1)
        frequency = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))  # (d_model / 2,)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency)[:, : d_model // 2]
    return nn.Embedding.from_pretrained(table, freeze=True)


class AttentionClassifier(nn.Module):
    def __init__(
        self,
        *,
        vocab_size: int,
        num_classes: int,
        d_model: int = 128,
        n_heads: int = 4,
        d_head: int | None = None,
        n_layers: int = 1,
        d_ff: int = 0,
        max_length: int = 128,
        dropout: float = 0.1,
        embedding_dropout: float = 0.1,
        attention_dropout: float = 0.0,
        head_dropout: float = 0.0,
        pooling: str = "mean",
        positions: str = "learned",
        bias: bool = False,
        scale: float | None = None,
        causal: bool = False,
        padding_idx: int = 0,
    ):
        super().__init__()
        if pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}, got {positions!r}")
        self.pooling, self.causal, self.max_length = pooling, causal, max_length
        self.token_embedding = nn.Embedding(vocab_size, d_model, padding_idx=padding_idx)
        self.position_embedding = position_embedding(positions, max_length, d_model)
        self.embedding_dropout = nn.Dropout(embedding_dropout)
        self.blocks = nn.ModuleList(
            Block(
                d_model=d_model, n_heads=n_heads, d_head=d_head, d_ff=d_ff, dropout=dropout,
                attention_dropout=attention_dropout, bias=bias, scale=scale,
            )
            for _ in range(n_layers)
        )
        self.attention_pool = AttentionPooling(d_model) if pooling == "attention" else None
        self.head_dropout = nn.Dropout(head_dropout)
        self.head = nn.Linear(d_model, num_classes)

    def forward(
        self, token_ids: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = False
    ) -> ClassifierOutput:
        """token_ids (B, L) int; key_padding_mask (B, L) bool, True marks padding."""
        B, L = token_ids.shape
        if L > self.max_length:
            raise ValueError(f"sequence length {L} exceeds max_length {self.max_length}")
        positions = torch.arange(L, device=token_ids.device)
        # Without weights to hand out, padding is left out of every per-token step (embedding, projections,
        # feed-forward, LayerNorm, dropout): only the N real tokens travel, and attention alone sees the (B, L)
        # grid. With short sentences padded to a long one that is most of the work; tests prove it equal.
        packed = key_padding_mask is not None and not need_weights
        if packed:
            real = ~key_padding_mask.bool()  # (B, L)
            x = self.token_embedding(token_ids[real]) + self.position_embedding(positions.expand(B, L)[real])  # (N, D)
        else:
            x = self.token_embedding(token_ids) + self.position_embedding(positions)  # (B, L, D)
        x = self.embedding_dropout(x)
        attention = []
        for block in self.blocks:
            x, weights = block(x, key_padding_mask, self.causal, need_weights, packed)
            attention.append(weights)
        if packed:
            x = unpack(x, real)  # (B, L, D), zeros at padding, which pooling ignores
        sentence = self.head_dropout(self.pool(x, key_padding_mask))  # (B, D)
        return ClassifierOutput(self.head(sentence), tuple(attention) if need_weights else None)

    def pool(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
        """(B, L, D) → (B, D), looking at real tokens only."""
        if self.pooling == "first":
            return x[:, 0]
        if self.pooling == "attention":
            return self.attention_pool(x, key_padding_mask)
        if key_padding_mask is None:
            return x.mean(dim=1) if self.pooling == "mean" else x.amax(dim=1)
        real = ~key_padding_mask.unsqueeze(-1)  # (B, L, 1)
        if self.pooling == "mean":
            return (x * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)
        return x.masked_fill(~real, torch.finfo(x.dtype).min).amax(dim=1)
