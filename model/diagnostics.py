"""Attention health: is each head over-uniform, collapsed, saturated, or ok? Pure torch, no Lightning.

What counts. A query row is *counted* when its query is a real token and it may look at two or more keys
(real keys, and for a causal model only keys at or before it). A row with a single allowed key has no choice
to make: its entropy is 0/log 1, undefined, and its max weight is 1 whatever the model learned, so counting it
would make every causal head look collapsed. Every figure below is a mean over counted rows (or their allowed
query×key pairs) of the whole validation set, accumulated exactly, not an average of batch averages.

Figures per (layer, head); layers are numbered from 0 like `model.blocks[i]`:
    entropy      mean of H(row) / log(allowed keys)     1 = uniform, 0 = one key takes everything
    max_weight   mean of the largest weight of a row     1/n for uniform, 1 for one-hot
    score_std    √(Σ (s - row mean)² / Σ pairs) of the pre-softmax scores s = q·k · scale, within each row
                 (softmax ignores a constant added to a row, so only the spread inside a row matters)

Letters in the shape comments: B batch, L tokens, H heads, N counted pairs.
"""

import math
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import NamedTuple

import torch

from model.attention import MultiHeadSelfAttention, attention_mask

VERDICTS = ("ok", "over-uniform", "collapsed", "saturated", "no-data")

ADVICE = {
    "ok": "nothing to do",
    "over-uniform": "scores too small to tell tokens apart (normal right after initialisation): check the scale is "
    "1/sqrt(d_k), not smaller; try a lower temperature (larger scale), a higher learning rate or training longer",
    "collapsed": "nearly all weight on one key without a large score spread (often one token, e.g. the first or "
    "padding, attracting every query): check the padding mask, lower the learning rate, try warmup or attention "
    "dropout",
    "saturated": "scores spread so wide that softmax is one-hot and its gradients vanish: check the scale is "
    "1/sqrt(d_k) (scale=1.0 saturates large heads), raise the temperature, lower the learning rate or the init scale",
    "no-data": "no real query had two or more keys to attend to, so there is nothing to judge",
}


@dataclass
class HealthThresholds:
    """When a head earns a verdict. Flat scalars, so they can be config values; checked in the order below.

    saturated:    score_std >= saturated_score_std and max_weight >= saturated_max_weight — peaked *because* the
                  scores are huge (a missing 1/√d_k, runaway weights): softmax's gradient p(1 - p) nearly vanishes.
                  A trained, scaled head sits at a spread of ~1-3; a Gaussian-like spread of 5 already puts 0.7-0.85
                  on the top key of 5-30 keys (scale=1.0 with d_k=64 multiplies a spread of 1 by 8).
    collapsed:    entropy <= collapsed_entropy — one key takes nearly all the weight (0.1 ≈ max weight 0.96 with ten
                  keys) while the spread stays moderate: a key stands out, the whole scale has not blown up.
    over-uniform: entropy >= uniform_entropy — rows barely differ from 1/n (0.95 ≈ a score spread of ~0.5, what a
                  freshly initialised layer shows).
    """

    uniform_entropy: float = 0.95
    collapsed_entropy: float = 0.1
    saturated_score_std: float = 5.0
    saturated_max_weight: float = 0.7


def allowed_keys(key_padding_mask: torch.Tensor | None, causal: bool, L: int, device=None) -> torch.Tensor:
    """(B or 1, 1, L, L) bool, True where a query may look at a key: the attention layer's own mask, negated."""
    blocked = attention_mask(key_padding_mask, causal, L, device)
    return torch.ones(1, 1, L, L, dtype=torch.bool, device=device) if blocked is None else ~blocked


def counted_rows(allowed: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """(B or 1, 1, L) bool: real queries with at least two allowed keys (see the module docstring)."""
    counted = allowed.sum(dim=-1) >= 2  # (B or 1, 1, L)
    if key_padding_mask is not None:
        counted = counted & ~key_padding_mask.bool()[:, None, :]
    return counted


def row_normalized_entropy(weights: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """(B, H, L, L) weights → (B, H, L) entropy / log(allowed keys); meaningful on counted rows only."""
    entropy = -torch.xlogy(weights, weights).sum(dim=-1)  # (B, H, L), 0·log 0 = 0
    n_keys = allowed.sum(dim=-1).to(weights.dtype)  # (B or 1, 1, L)
    return entropy / n_keys.clamp(min=2).log()


def normalized_entropy(
    weights: torch.Tensor, key_padding_mask: torch.Tensor | None = None, causal: bool = False
) -> torch.Tensor:
    """One layer's weights (B, H, L, L) → (H,) mean normalized entropy over counted rows (NaN if none).

    1.0 is uniform over the allowed keys, 0.0 is one-hot. For a whole model, stack one call per layer or use
    AttentionHealth, which also accumulates over batches.
    """
    B, H, L, _ = weights.shape
    allowed = allowed_keys(key_padding_mask, causal, L, weights.device)
    counted = counted_rows(allowed, key_padding_mask).expand(B, H, L)
    per_row = row_normalized_entropy(weights, allowed)
    return (per_row * counted).sum(dim=(0, 2)) / counted.sum(dim=(0, 2))


def attention_scores(layer: MultiHeadSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer's pre-softmax scores for input x (B, L, D): (q @ kᵀ) · scale, (B, H, L, L), before masking."""
    q = layer.split_heads(layer.w_q(x))  # (B, H, L, d)
    k = layer.split_heads(layer.w_k(x))  # (B, H, L, d)
    return (q @ k.transpose(-2, -1)) * layer.scale  # (B, H, L, L)


class CapturedAttention(NamedTuple):
    logits: torch.Tensor  # (B, num_classes)
    weights: tuple[torch.Tensor, ...]  # per layer (B, H, L, L)
    scores: tuple[torch.Tensor, ...]  # per layer (B, H, L, L), pre-softmax, unmasked
    causal: bool  # whether the layers masked future keys


@torch.no_grad()
def capture_attention(
    model, token_ids: torch.Tensor, key_padding_mask: torch.Tensor | None = None
) -> CapturedAttention:
    """Run an AttentionClassifier once with hooks on each `blocks[i].attention`, recomputing its scores from the
    input the layer actually received. The model and its attention layer are left untouched."""
    scores, causal_flags = [], []

    def record(layer, args, kwargs, output):
        x = args[0] if args else kwargs["x"]
        causal_flags.append(bool(args[2] if len(args) > 2 else kwargs.get("causal", False)))
        scores.append(attention_scores(layer, x))

    with ExitStack() as hooks:
        for block in model.blocks:
            hooks.callback(block.attention.register_forward_hook(record, with_kwargs=True).remove)
        logits, weights = model(token_ids, key_padding_mask, need_weights=True)
    return CapturedAttention(logits, tuple(weights), tuple(scores), any(causal_flags))


@dataclass
class HealthFigures:
    entropy: torch.Tensor  # (n_layers, H) mean normalized entropy
    max_weight: torch.Tensor  # (n_layers, H) mean largest weight of a row
    score_std: torch.Tensor  # (n_layers, H) within-row spread of the pre-softmax scores
    rows: int  # counted query rows behind each figure
    weight_sample: torch.Tensor  # (n_layers, H, ≤ sample_size) weights drawn uniformly from counted pairs

    def verdicts(self, thresholds: HealthThresholds | None = None) -> list[list[str]]:
        """verdicts[layer][head]."""
        return [
            [
                verdict(float(e), float(m), float(s), thresholds)
                for e, m, s in zip(self.entropy[layer], self.max_weight[layer], self.score_std[layer])
            ]
            for layer in range(self.entropy.shape[0])
        ]


class AttentionHealth:
    """Accumulates attention figures over the batches of a validation pass; `compute()` gives HealthFigures.

    Sums live in float64 on the device of the first batch; the histogram sample is a uniform sample without
    replacement of all counted weights seen (each weight gets a random key, the smallest `sample_size` keys stay).
    """

    def __init__(self, sample_size: int = 4096, seed: int = 0):
        self.sample_size, self.seed = sample_size, seed
        self.reset()

    def reset(self) -> None:
        self.sums = None  # dict of (n_layers, H) float64: entropy, max_weight, squared_deviation
        self.rows = self.pairs = 0
        self.sample = self.sample_keys = None  # (n_layers, H, ≤ sample_size)
        self.generator = None

    @torch.no_grad()
    def update(
        self,
        weights: Sequence[torch.Tensor],
        scores: Sequence[torch.Tensor],
        key_padding_mask: torch.Tensor | None = None,
        causal: bool = False,
    ) -> None:
        """weights and scores: one (B, H, L, L) per layer, e.g. from `capture_attention`."""
        B, H, L, _ = weights[0].shape
        device = weights[0].device
        allowed = allowed_keys(key_padding_mask, causal, L, device)
        counted = counted_rows(allowed, key_padding_mask).expand(B, 1, L)  # (B, 1, L)
        pairs = (allowed & counted[..., None]).expand(B, 1, L, L)  # (B, 1, L, L): allowed keys of counted rows
        n_keys = allowed.sum(dim=-1).expand(B, 1, L)  # (B, 1, L)
        if self.sums is None:
            zeros = torch.zeros(len(weights), H, dtype=torch.float64, device=device)
            self.sums = {name: zeros.clone() for name in ("entropy", "max_weight", "squared_deviation")}
            self.generator = torch.Generator(device=device).manual_seed(self.seed)
        for layer, (w, s) in enumerate(zip(weights, scores)):
            w, s = w.double(), s.double()
            self.sums["entropy"][layer] += (row_normalized_entropy(w, allowed) * counted).sum(dim=(0, 2))
            self.sums["max_weight"][layer] += (w.amax(dim=-1) * counted).sum(dim=(0, 2))
            row_mean = (s * allowed).sum(dim=-1, keepdim=True) / n_keys[..., None].clamp(min=1)  # (B, H, L, 1)
            self.sums["squared_deviation"][layer] += ((s - row_mean).square() * pairs).sum(dim=(0, 2, 3))
        self.rows += int(counted.sum())
        self.pairs += int(pairs.sum())
        self.add_to_sample(torch.stack([w.transpose(0, 1)[:, pairs[:, 0]] for w in weights]))

    def add_to_sample(self, values: torch.Tensor) -> None:
        """values (n_layers, H, N); keep the sample_size values with the smallest random keys among all seen."""
        keys = torch.rand(values.shape, generator=self.generator, device=values.device)
        if self.sample is not None:
            values, keys = torch.cat([self.sample, values], dim=-1), torch.cat([self.sample_keys, keys], dim=-1)
        keep = keys.topk(min(self.sample_size, keys.shape[-1]), dim=-1, largest=False).indices
        self.sample, self.sample_keys = values.gather(-1, keep).float(), keys.gather(-1, keep)

    def compute(self) -> HealthFigures:
        if self.sums is None:
            raise RuntimeError("AttentionHealth.compute() called before any update()")
        nan = torch.tensor(math.nan, dtype=torch.float64)
        rows = self.rows or nan
        return HealthFigures(
            entropy=(self.sums["entropy"] / rows).float().cpu(),
            max_weight=(self.sums["max_weight"] / rows).float().cpu(),
            score_std=(self.sums["squared_deviation"] / (self.pairs or nan)).sqrt().float().cpu(),
            rows=self.rows,
            weight_sample=self.sample.cpu(),
        )


def verdict(entropy: float, max_weight: float, score_std: float, thresholds: HealthThresholds | None = None) -> str:
    """One head's verdict from its figures; the rules and their order are in HealthThresholds' docstring."""
    t = thresholds or HealthThresholds()
    if math.isnan(entropy):
        return "no-data"
    if score_std >= t.saturated_score_std and max_weight >= t.saturated_max_weight:
        return "saturated"
    if entropy <= t.collapsed_entropy:
        return "collapsed"
    if entropy >= t.uniform_entropy:
        return "over-uniform"
    return "ok"


def advice(verdict_name: str) -> str:
    """One line: the likely cause of a verdict and what to try."""
    return ADVICE[verdict_name]


def warning_line(layer: int, head: int, verdict_name: str, figures: HealthFigures) -> str:
    """e.g. 'attention layer 0 head 2 is saturated (score std 12.40, max weight 0.97, entropy 0.08): <advice>'."""
    entropy, max_weight = figures.entropy[layer, head].item(), figures.max_weight[layer, head].item()
    score_std = figures.score_std[layer, head].item()
    numbers = {
        "saturated": f"score std {score_std:.2f}, max weight {max_weight:.2f}, entropy {entropy:.2f}",
        "collapsed": f"entropy {entropy:.2f}, max weight {max_weight:.2f}, score std {score_std:.2f}",
    }.get(verdict_name, f"entropy {entropy:.2f}, max weight {max_weight:.2f}, score std {score_std:.2f}")
    return f"attention layer {layer} head {head} is {verdict_name} ({numbers}): {advice(verdict_name)}"


def verdict_table_markdown(figures: HealthFigures, thresholds: HealthThresholds | None = None) -> str:
    """A markdown table, one row per (layer, head), for TensorBoard's text tab."""
    lines = [
        "| layer | head | entropy | max weight | score std | verdict |",
        "|---:|---:|---:|---:|---:|:---|",
    ]
    for layer, heads in enumerate(figures.verdicts(thresholds)):
        for head, name in enumerate(heads):
            lines.append(
                f"| {layer} | {head} | {figures.entropy[layer, head]:.3f} | {figures.max_weight[layer, head]:.3f} "
                f"| {figures.score_std[layer, head]:.3f} | {name} |"
            )
    return "\n".join(lines)
