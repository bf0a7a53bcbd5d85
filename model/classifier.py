"""The classifier network, plain PyTorch: embedding → N × attention block → pooling → linear head.

Built from one NetworkConfig (model/config.py). Letters in the shape comments: B batch, L tokens, D width,
N real (not padding) tokens of a batch.
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model.attention import AttentionWeights, unpack
from model.config import NetworkConfig
from model.kind import Kind
from model.kinds import attention_kind
from model.ngrams import NgramBag


class ClassifierOutput(NamedTuple):
    logits: torch.Tensor  # (B, num_classes)
    attention: tuple[AttentionWeights, ...] | None  # one per layer, when asked for


def attention_layer(config: NetworkConfig, n_heads: int | None = None) -> Kind:
    """A layer of the attention kind the config names (model/kinds.py; a user's class in its adapter), with n_heads
    heads (default config.n_heads; fewer in a pruned layer) of config.head_size each."""
    return attention_kind(config.attention).build(config, n_heads)


class BlockReference(NamedTuple):
    """A block's definition recomputed densely in float64 (Block.reference), for the doctor (monitor/contract.py)."""

    after_attention: torch.Tensor  # (N, D) LayerNorm(x + attention's output)
    output: torch.Tensor  # (N, D) the block's output: after_attention, or LayerNorm(h + FFN(h)) after it


def layer_norm_reference(norm: nn.LayerNorm, t: torch.Tensor) -> torch.Tensor:
    """norm's LayerNorm of t in float64, from its own gain, bias and eps."""
    gain, bias = (None if w is None else w.double() for w in (norm.weight, norm.bias))
    return F.layer_norm(t.double(), norm.normalized_shape, gain, bias, norm.eps)


def feed_forward_reference(ffn: nn.Sequential, t: torch.Tensor) -> torch.Tensor:
    """W_2 GELU(W_1 t + b_1) + b_2 in float64 from the feed-forward's two Linear layers (evaluation: no dropout)."""
    first, last = ffn[0], ffn[-1]
    hidden = F.gelu(F.linear(t.double(), first.weight.double(), None if first.bias is None else first.bias.double()))
    return F.linear(hidden, last.weight.double(), None if last.bias is None else last.bias.double())


class Block(nn.Module):
    """Self-attention + residual + LayerNorm, then (optionally) a position-wise feed-forward the same way."""

    def __init__(self, config: NetworkConfig, n_heads: int | None = None):
        super().__init__()
        self.attention = attention_layer(config, n_heads)
        self.norm1 = nn.LayerNorm(config.d_model)
        self.ffn = None
        if config.d_ff > 0:
            self.ffn = nn.Sequential(
                nn.Linear(config.d_model, config.d_ff), nn.GELU(), nn.Dropout(config.dropout),
                nn.Linear(config.d_ff, config.d_model),
            )
            self.norm2 = nn.LayerNorm(config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x, key_padding_mask, need_weights=False):
        """x (N, D): the real tokens of a (B, L) batch whose padding key_padding_mask marks. Everything but
        attention is per token, so padding never enters it."""
        attended, weights = self.attention.forward_packed(x, key_padding_mask, need_weights)
        x = self.norm1(x + self.dropout(attended))
        if self.ffn is not None:
            x = self.norm2(x + self.dropout(self.ffn(x)))
        return x, weights

    def reference(self, x: torch.Tensor, attended: torch.Tensor, between: torch.Tensor | None = None) -> BlockReference:
        """This block's definition recomputed the plainest way, in float64 and without dropout (evaluation), from its
        own weights (the doctor's reference, monitor/contract.py): x (N, D) the block's input, attended (N, D) its
        attention layer's output; between (N, D) what its feed-forward received (default: the reference's own), so
        that each sublayer is judged on its own input."""
        after = layer_norm_reference(self.norm1, x.double() + attended.double())
        if self.ffn is None:
            return BlockReference(after, after)
        h = after if between is None else between.double()
        return BlockReference(after, layer_norm_reference(self.norm2, h + feed_forward_reference(self.ffn, h)))


class AttentionPooling(nn.Module):
    """A learned query scores every real token; the sentence vector is the softmax-weighted sum."""

    def __init__(self, d_model: int):
        super().__init__()
        self.score = nn.Linear(d_model, 1)

    def forward(self, x, key_padding_mask):
        scores = self.score(x).squeeze(-1)  # (B, L)
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


class AttentionEncoder(nn.Module):
    """Token + position embeddings → N × attention block: a vector per real token. The classifier and the
    pretraining network (model/pretraining.py) are this with different heads, under the same parameter names, so
    a pretrained encoder's weights load into the classifier as they are."""

    def __init__(self, config: NetworkConfig):
        super().__init__()
        self.config = config = config.resolved()  # attention "auto" becomes the kind it stands for
        # No padding_idx: padding never reaches the embedding (encode() embeds real tokens only).
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = position_embedding(config.positions, config.max_length, config.d_model)
        with torch.no_grad():  # N(0, 1) → N(0, embedding_std²), scaled in place: the random stream is unchanged
            self.token_embedding.weight.mul_(config.embedding_std)
            if config.positions == "learned":
                self.position_embedding.weight.mul_(config.embedding_std)
        # BERT's LayerNorm on token + position: attention sees unit-scale inputs whatever embedding_std starts at.
        self.embedding_norm = nn.LayerNorm(config.d_model) if config.embedding_norm else None
        self.embedding_dropout = nn.Dropout(config.embedding_dropout)
        self.blocks = nn.ModuleList(Block(config, config.heads_in_layer(i)) for i in range(config.n_layers))

    @property
    def max_length(self) -> int:
        return self.config.max_length

    def encode(
        self, token_ids: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor, list]:
        """token_ids (B, L) int; key_padding_mask (B, L) bool, True marks padding (None: no padding).
        Returns (x (N, D) the real tokens' vectors in row-major order, real (B, L) bool, one attention per layer).

        One path whether or not weights are asked for: padding is left out of every per-token step (embedding,
        projections, feed-forward, LayerNorm, dropout): only the N real tokens travel, and attention alone sees
        the (B, L) grid. need_weights only makes each layer hand out what it computed. With nothing padded
        (N = B·L) the N rows are the grid itself, which attention reads in place (forward_packed).
        """
        B, L = token_ids.shape
        if L > self.max_length:
            raise ValueError(f"sequence length {L} exceeds max_length {self.max_length}")
        if key_padding_mask is None:  # nothing padded: the L position vectors broadcast, no gather of N rows
            key_padding_mask = torch.zeros(B, L, dtype=torch.bool, device=token_ids.device)
            real = ~key_padding_mask
            # The token vectors come out (N, D) in row-major order on either path (explanations swap them there).
            x = (self.token_embedding(token_ids.flatten()).view(B, L, -1)
                 + self.position_embedding(torch.arange(L, device=token_ids.device))).flatten(0, 1)  # (N, D)
        else:
            real = ~key_padding_mask.bool()  # (B, L)
            rows, positions = real.nonzero(as_tuple=True)  # (N,) each: the real places, row-major (forward_packed)
            x = self.token_embedding(token_ids[rows, positions]) + self.position_embedding(positions)  # (N, D)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        x = self.embedding_dropout(x)
        attention = []
        for block in self.blocks:
            x, weights = block(x, key_padding_mask, need_weights)
            attention.append(weights)
        return x, real, attention

    def reference_embeddings(self, token_ids: torch.Tensor, key_padding_mask: torch.Tensor,
                             positions: bool = True) -> torch.Tensor:
        """(N, D) float64: the first block's input by definition, from the tables' own weights: token + position
        vectors of the real tokens in row-major order, through embedding_norm when there is one (evaluation: no
        dropout). positions=False leaves the position vectors out (what a network that drops them computes)."""
        rows, places = (~key_padding_mask.bool()).nonzero(as_tuple=True)
        x = self.token_embedding.weight.double()[token_ids[rows, places]]
        if positions:
            x = x + self.position_embedding.weight.double()[places]
        return x if self.embedding_norm is None else layer_norm_reference(self.embedding_norm, x)


class AttentionClassifier(AttentionEncoder):
    def __init__(self, config: NetworkConfig):
        super().__init__(config)
        self.attention_pool = AttentionPooling(config.d_model) if config.pooling == "attention" else None
        self.head_dropout = nn.Dropout(config.head_dropout)
        self.head = nn.Linear(config.d_model, config.num_classes)
        self.ngram_bag = None
        if config.ngrams:  # n-gram votes summed into the logits beside the attention-pooled sentence
            self.ngram_bag = NgramBag(order=config.ngrams, vocab_size=config.vocab_size, buckets=config.ngram_buckets,
                                      num_classes=config.num_classes, fitted=config.ngram_fitted)

    def forward(
        self, token_ids: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = False,
        ngram_logits: torch.Tensor | None = None,
    ) -> ClassifierOutput:
        """token_ids (B, L) int; key_padding_mask (B, L) bool, True marks padding (None: no padding).
        ngram_logits (B, C): the fitted n-gram bag's logits given in its place (training: each text's out-of-fold
        logits, training/ngram_fit.py)."""
        x, real, attention = self.encode(token_ids, key_padding_mask, need_weights)
        # (B, L, D), zeros at padding, which pooling ignores; with nothing padded the N = B·L rows are the grid
        x = x.view(*real.shape, -1) if key_padding_mask is None else unpack(x, real)
        sentence = self.head_dropout(self.pool(x, ~real))  # (B, D)
        logits = self.head(sentence)  # (B, C)
        if ngram_logits is not None:
            logits = logits + ngram_logits
        elif self.ngram_bag is not None:
            logits = logits + self.ngram_bag(token_ids, ~real)
        return ClassifierOutput(logits, tuple(attention) if need_weights else None)

    def pool(self, x: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        """(B, L, D) → (B, D), looking at real tokens only."""
        pooling = self.config.pooling
        if pooling == "first":
            return x[:, 0]
        if pooling == "attention":
            return self.attention_pool(x, key_padding_mask)
        real = ~key_padding_mask.unsqueeze(-1)  # (B, L, 1)
        if pooling == "mean":
            return (x * real).sum(dim=1) / real.sum(dim=1).clamp(min=1)
        return x.masked_fill(~real, torch.finfo(x.dtype).min).amax(dim=1)
