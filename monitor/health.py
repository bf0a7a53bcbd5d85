"""Attention health: is each head over-uniform, collapsed, saturated, or ok? Pure torch, no Lightning.

The figures are read from what each layer computed in the forward pass (`AttentionWeights`: its weights, its
pre-softmax scores and its own mask), never recomputed here, so a change to how the layer makes scores shows up
in the figures as it is. Every attention kind hands out the same three fields over its own key layout (the last
axis): L keys for full attention, a band of 2w+1 for local, k projected "virtual keys" for linformer, g global
keys and a band for sparse, whose g global query rows come apart in `global_rows` (model/long_attention.py). The
figures only ever look along that last axis at the places the layer's `blocked` allows, so they mean the same
for every kind: normalized entropy over the keys a query can actually see.

What counts. A query row is *counted* when its query is a real token and it may look at two or more keys (the
keys the layer's own mask allows: real keys, and for a causal layer only keys at or before it). A row with a
single allowed key has no choice
to make: its entropy is 0/log 1, undefined, and its max weight is 1 whatever the model learned, so counting it
would make every causal head look collapsed.

Cost. A validation batch of long texts holds millions of rows × keys; reading them all cost more than the
validation pass itself (7 min 40 s per pass on IMDB at 512 tokens). So the figures are read from a fixed sample
of at most `rows_per_batch` counted rows per batch (the same rows every epoch: the generator is reseeded at each
reset), each standing for its batch's share of counted rows, so the sums estimate those over every counted row
without bias; with fewer counted rows than that, every row is read and the figures are exact. Every figure below is
a mean over counted rows (or their allowed query×key pairs) of the whole validation set, accumulated as sums, not
an average of batch averages.

Figures per (layer, head); layers are numbered from 0 like `model.blocks[i]`:
    entropy      mean of H(row) / log(allowed keys)     1 = uniform, 0 = one key takes everything
    max_weight   mean of the largest weight of a row     1/n for uniform, 1 for one-hot
    score_std    √(Σ (s - row mean)² / Σ pairs) of the pre-softmax scores s = q·k · scale, within each row
                 (softmax ignores a constant added to a row, so only the spread inside a row matters)
    distance     mean attention distance Σ_j w_ij |i − j| in tokens: how far a head looks (a locality figure; low
                 = local patterns). NaN for linformer, whose projected keys are no single token

Letters in the shape comments: B batch, L tokens (query rows), K keys of a row, H heads, R sampled rows,
N counted pairs.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model.attention import AttentionWeights

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


def allowed_keys(blocked: torch.Tensor | None, n_keys: int, device=None) -> torch.Tensor:
    """(B or 1, 1, L or 1, K) bool, True where a query may look at a key: the layer's own mask, negated."""
    return torch.ones(1, 1, 1, n_keys, dtype=torch.bool, device=device) if blocked is None else ~blocked


def counted_rows(allowed: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """(B or 1, 1, L or 1) bool: real queries with at least two allowed keys (see the module docstring).
    key_padding_mask (B, L) marks the padded queries (for the sparse kind's global rows: its first g columns)."""
    counted = allowed.sum(dim=-1) >= 2  # (B or 1, 1, L or 1)
    if key_padding_mask is not None:
        counted = counted & ~key_padding_mask.bool()[:, None, :]
    return counted


def row_normalized_entropy(weights: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """(…, K) weights → (…) entropy / log(allowed keys); meaningful on counted rows only."""
    entropy = -torch.xlogy(weights, weights).sum(dim=-1)  # (…), 0·log 0 = 0
    n_keys = allowed.sum(dim=-1).to(weights.dtype)  # (…) broadcastable
    return entropy / n_keys.clamp(min=2).log()


def normalized_entropy(attention: AttentionWeights, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
    """One layer's attention → (H,) mean normalized entropy over counted rows (NaN if none); the sparse kind's
    global rows are not included here (AttentionHealth includes them).

    1.0 is uniform over the allowed keys, 0.0 is one-hot. For a whole model over many batches use AttentionHealth.
    """
    B, H, L, K = attention.weights.shape
    allowed = allowed_keys(attention.blocked, K, attention.weights.device)
    counted = counted_rows(allowed, key_padding_mask).expand(B, H, L)
    per_row = row_normalized_entropy(attention.weights, allowed)
    return (per_row * counted).sum(dim=(0, 2)) / counted.sum(dim=(0, 2))


@dataclass
class HealthFigures:
    entropy: torch.Tensor  # (n_layers, H) mean normalized entropy
    max_weight: torch.Tensor  # (n_layers, H) mean largest weight of a row
    score_std: torch.Tensor  # (n_layers, H) within-row spread of the pre-softmax scores
    rows: int  # counted query rows behind each figure
    weight_sample: torch.Tensor  # (n_layers, H, ≤ sample_size) weights drawn uniformly from counted pairs
    heads: list[int] | None = None  # heads of each layer when a pruned network's layers differ (the rest is NaN)
    distance: torch.Tensor | None = None  # (n_layers, H) mean attention distance in tokens (NaN: virtual keys)

    def verdicts(self, thresholds: HealthThresholds | None = None) -> list[list[str]]:
        """verdicts[layer][head], over the heads each layer has."""
        heads = self.heads or [self.entropy.shape[1]] * self.entropy.shape[0]
        return [
            [
                verdict(float(e), float(m), float(s), thresholds)
                for e, m, s in zip(self.entropy[layer], self.max_weight[layer], self.score_std[layer])
            ][: heads[layer]]
            for layer in range(self.entropy.shape[0])
        ]


class AttentionHealth:
    """Accumulates attention figures over the batches of a validation pass; `compute()` gives HealthFigures.

    Sums live in float64 on the device of the first batch. At most `rows_per_batch` counted rows of a batch are
    read (None: all of them; see the module docstring). The histogram sample is a uniform sample without
    replacement of the weights of the rows read (each weight gets a random key, the smallest `sample_size` keys stay).
    """

    def __init__(self, sample_size: int = 4096, seed: int = 0, rows_per_batch: int | None = 256):
        if rows_per_batch is not None and rows_per_batch < 1:
            raise ValueError(f"rows_per_batch must be >= 1 or None, got {rows_per_batch}")
        self.sample_size, self.seed, self.rows_per_batch = sample_size, seed, rows_per_batch
        self.reset()

    def reset(self) -> None:
        self.sums = None  # dict of (n_layers, H) float64: entropy, max_weight, squared_deviation
        self.heads = None  # heads of each layer
        self.rows, self.pairs = 0, 0.0  # counted rows; (estimated) allowed pairs of counted rows
        self.rows_read = 0
        self.sample = self.sample_keys = None  # (n_layers, H, ≤ sample_size)
        self.generator = None

    @torch.no_grad()
    def update(self, attention: Sequence[AttentionWeights], key_padding_mask: torch.Tensor | None = None, *,
               key_layout: str = "tokens") -> None:
        """attention: one AttentionWeights (or LongAttentionWeights) per layer, as the network handed them out for
        this batch (`model(ids, key_padding_mask, need_weights=True).attention`); all layers share one mask.
        key_layout: the kind's (`ATTENTION_KINDS[config.attention].key_layout`, model/kinds.py)."""
        weights = attention[0].weights
        if self.sums is None:
            # A pruned network's layers may have different head counts: figures are (n_layers, most heads).
            self.heads = [layer.weights.shape[1] for layer in attention]
            zeros = torch.zeros(len(attention), max(self.heads), dtype=torch.float64, device=weights.device)
            self.sums = {name: zeros.clone() for name in ("entropy", "max_weight", "squared_deviation", "distance")}
            self.generator = torch.Generator(device=weights.device).manual_seed(self.seed)
        key_positions = None if key_layout == "tokens" else attention[0].key_positions
        self.update_rows(attention, key_padding_mask, key_positions)
        if key_layout != "tokens" and attention[0].global_rows is not None:  # sparse's global queries, over all L keys
            global_rows = [layer.global_rows for layer in attention]
            g = global_rows[0].weights.shape[2]
            self.update_rows(global_rows, None if key_padding_mask is None else key_padding_mask[:, :g], None)

    def update_rows(self, attention: Sequence[AttentionWeights], query_padding: torch.Tensor | None,
                    key_positions: torch.Tensor | None) -> None:
        """Adds one set of query rows, (B, H, L, K) per layer, sharing one mask; query_padding (B, L) or None;
        key_positions (L, K), the token of each column, or None when column k is token k."""
        B, H, L, K = attention[0].weights.shape
        device = attention[0].weights.device
        allowed = allowed_keys(attention[0].blocked, K, device)  # (B or 1, 1, L or 1, K)
        counted = counted_rows(allowed, query_padding).expand(B, 1, L)[:, 0]  # (B, L)
        batch_index, query_index = counted.nonzero(as_tuple=True)  # (R,) each
        total = len(batch_index)
        if total == 0:
            return
        if self.rows_per_batch is not None and total > self.rows_per_batch:
            pick = torch.randperm(total, generator=self.generator, device=device)[: self.rows_per_batch]
            batch_index, query_index = batch_index[pick], query_index[pick]
        share = total / len(batch_index)  # counted rows each row read stands for
        row_allowed = allowed.expand(B, 1, L, K)[batch_index, 0, query_index]  # (R, K)
        n_keys = row_allowed.sum(dim=-1, keepdim=True)  # (R, 1)
        distance = key_distance(key_positions, query_index, K).to(device)  # (R, K)
        for layer, part in enumerate(attention):
            # Rows first: (B, H, L, K)[b, :, i] with R pairs (b, i) → (R, H, K); only these are read.
            w = part.weights[batch_index, :, query_index].double()  # (R, H, K)
            s = part.scores[batch_index, :, query_index].double()  # (R, H, K)
            h = w.shape[1]
            self.sums["entropy"][layer, :h] += share * row_normalized_entropy(w, row_allowed[:, None]).sum(dim=0)
            self.sums["max_weight"][layer, :h] += share * w.amax(dim=-1).sum(dim=0)
            pairs = row_allowed[:, None].to(s.dtype)  # (R, 1, K)
            row_mean = (s * pairs).sum(dim=-1, keepdim=True) / n_keys[:, None]  # (R, H, 1)
            self.sums["squared_deviation"][layer, :h] += share * ((s - row_mean).square() * pairs).sum(dim=(0, 2))
            self.sums["distance"][layer, :h] += share * (w * distance[:, None]).sum(dim=(0, 2))
        self.rows += total
        self.rows_read += len(batch_index)
        self.pairs += share * int(row_allowed.sum())
        read = [part.weights[batch_index, :, query_index].transpose(0, 1)[:, row_allowed] for part in attention]
        most = max(self.heads)  # a pruned layer's missing heads: NaN rows
        read = [torch.cat([r, r.new_full((most - r.shape[0], r.shape[1]), math.nan)]) for r in read]
        self.add_to_sample(torch.stack(read))  # (n_layers, H, pairs read)

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
        nothing = torch.zeros(*self.sums["entropy"].shape, 0)  # no counted row at all: an empty sample
        missing = torch.arange(max(self.heads)) >= torch.tensor(self.heads)[:, None]  # (n_layers, H) pruned heads
        figures = {
            "entropy": self.sums["entropy"].cpu() / rows,
            "max_weight": self.sums["max_weight"].cpu() / rows,
            "score_std": (self.sums["squared_deviation"].cpu() / (self.pairs or nan)).sqrt(),
            "distance": self.sums["distance"].cpu() / rows,
        }
        return HealthFigures(
            **{name: value.masked_fill(missing, math.nan).float() for name, value in figures.items()},
            rows=self.rows,
            weight_sample=(self.sample if self.sample is not None else nothing).cpu(),
            heads=self.heads if len(set(self.heads)) > 1 else None,
        )


def key_distance(positions: torch.Tensor | None, query_index: torch.Tensor, n_keys: int) -> torch.Tensor:
    """(R, K) float64: |query − key| in tokens for each read row's K columns, in the layer's key layout
    (`key_positions` (L, K) for the long kinds, None: column = token); NaN for a virtual (projected) key."""
    if positions is None:
        keys = torch.arange(n_keys, device=query_index.device).expand(len(query_index), n_keys)  # (R, K)
    else:
        keys = positions.to(query_index.device)[query_index]  # (R, K)
    distance = (keys - query_index[:, None]).abs().double()
    return distance.masked_fill(keys < 0, math.nan)


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


def distance_cell(figures: HealthFigures, layer: int, head: int) -> str:
    """The head's mean attention distance for the verdict table: tokens, one decimal; "n/a" for projected keys."""
    value = math.nan if figures.distance is None else float(figures.distance[layer, head])
    return "n/a" if math.isnan(value) else f"{value:.1f}"


def verdict_table_markdown(figures: HealthFigures, thresholds: HealthThresholds | None = None) -> str:
    """A markdown table, one row per (layer, head), for TensorBoard's text tab."""
    lines = [
        "| layer | head | entropy | max weight | score std | distance | verdict |",
        "|---:|---:|---:|---:|---:|---:|:---|",
    ]
    for layer, heads in enumerate(figures.verdicts(thresholds)):
        for head, name in enumerate(heads):
            lines.append(
                f"| {layer} | {head} | {figures.entropy[layer, head]:.3f} | {figures.max_weight[layer, head]:.3f} "
                f"| {figures.score_std[layer, head]:.3f} | {distance_cell(figures, layer, head)} | {name} |"
            )
    return "\n".join(lines)
