"""Attention health figures, read from what each layer computed and from the batch itself. Pure torch, no Lightning.

The figures are read from what each layer computed in the forward pass (`AttentionWeights`: its weights, its
pre-softmax scores and its own mask), never recomputed here, so a change to how the layer makes scores shows up
in the figures as it is. Every attention kind hands out the same three fields over its own key layout (the last
axis): L keys for full attention, a band of 2w+1 for local, k projected "virtual keys" for linformer, g global
keys and a band for sparse, whose g global query rows come apart in `global_rows` (model/long_attention.py).

Two readings of "which keys a query may see". The layer's own mask (`blocked`) says what the layer allowed: the
spread figures (entropy, max weight, score spread, gradient passed) are taken over those keys. The batch's own
lengths (its padding mask, made from the lengths by the data module) and the config's look-ahead flag say what it
*should* have allowed: the mask figures (weight on padding, rows that see no real key, row sums, weight on later
keys) are taken against that, so a layer that ignores, inverts or widens its mask shows in them.

Which rows count. A query row is *counted* when its query is a real token (by the batch's lengths), it should
see two or more real keys (for a causal config, keys at or before it), and its layer does not let it see exactly
one (a kind may narrow what a query sees; a row the layer lets see none is counted: a mask that blocks everything).
A row with a single key has no choice to make: its entropy is 0/log 1, undefined, and its max weight is 1 whatever
the model learned, so counting it would make every causal head look collapsed. The sparse kind's global queries are
counted in `global_rows`, not in the main layout, where the layer blocks them by design.

Cost. A validation batch of long texts holds millions of rows × keys; reading them all cost more than the
validation pass itself (7 min 40 s per pass on IMDB at 512 tokens). So the figures are read from a fixed sample
of at most `rows_per_batch` counted rows per batch (the same rows every epoch: the generator is reseeded at each
reset), each standing for its batch's share of counted rows, so the sums estimate those over every counted row
without bias; with fewer counted rows than that, every row is read and the figures are exact. Every figure below is
a mean over counted rows (or their allowed query×key pairs) of the whole validation set, accumulated as sums, not
an average of batch averages.

Figures per (layer, head); layers are numbered from 0 like `model.blocks[i]`:
    entropy           mean of H(row) / log(allowed keys)      1 = uniform, 0 = one key takes everything
    max_weight        mean of the largest weight of a row      1/n for uniform, 1 for one-hot
    score_std         √(Σ (s - row mean)² / Σ pairs) of the pre-softmax scores s = q·k · scale over allowed keys
                      (softmax ignores a constant added to a row, so only the spread inside a row matters)
    gradient_pass     mean of (1 − Σ w²) / (1 − 1/n) over rows, n allowed keys: the share of gradient a softmax row
                      passes back to its scores, 1 for uniform, 0 for one-hot (a saturated softmax passes none)
    distance          mean attention distance Σ_j w_ij |i − j| in tokens: how far a head looks
    pad_weight        mean weight a row puts on keys that are padding by the batch's lengths (or band slots past
                      the text): exactly 0 when the mask works
    real_zero_share   share of rows that give every real key exactly 0 (all weight on padding, or none at all)
    row_sum_error     mean |Σ_k w − 1|: 0 when each row is a softmax over its keys
    future_zero_share non-causal configs: share of rows with later real keys that give all of them exactly 0
                      (a look-ahead mask nobody asked for makes it 1)
    future_weight     causal configs: mean weight on later real keys (exactly 0 when the look-ahead mask works)
and per layer, head × head (symmetric, 1 on the diagonal):
    head_similarity   mean over rows of 1 − ½ Σ_k |w_h − w_h'|: 1 for identical maps (two uniform heads too)
    score_correlation Σ s̃_h s̃_h' / √(Σ s̃_h² Σ s̃_h'²) of the row-centred scores: 1 when two heads score alike
                      whatever their spread; near 0 for independently initialised heads
The key-position figures (pad_weight, real_zero_share, future_*, distance) are NaN for linformer, whose projected
keys are no single token.

Letters in the shape comments: B batch, L tokens (query rows), K keys of a row, H heads, R sampled rows.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from model.attention import AttentionWeights

# Per-head sums, each divided by the counted rows at the end (pad and future figures by their own row counts).
ROW_SUMS = ("entropy", "max_weight", "gradient_pass", "distance", "pad_weight", "real_zero", "row_sum_error",
            "future_weight", "future_zero", "future_rows")
PAIR_SUMS = ("head_similarity", "score_products")
ROWS_PER_BATCH = 256  # query rows a validation batch gives the figures by default (the monitor's health_rows)


def allowed_keys(blocked: torch.Tensor | None, n_keys: int, device=None) -> torch.Tensor:
    """(B or 1, 1, L or 1, K) bool, True where a query may look at a key: the layer's own mask, negated."""
    return torch.ones(1, 1, 1, n_keys, dtype=torch.bool, device=device) if blocked is None else ~blocked


def counted_rows(allowed: torch.Tensor, key_padding_mask: torch.Tensor | None) -> torch.Tensor:
    """(B or 1, 1, L or 1) bool: real queries with at least two allowed keys, by the layer's own mask.
    key_padding_mask (B, L) marks the padded queries."""
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
    """One layer's attention → (H,) mean normalized entropy over the rows its own mask lets choose (NaN if none);
    the sparse kind's global rows are not included here (AttentionHealth includes them).

    1.0 is uniform over the allowed keys, 0.0 is one-hot. For a whole model over many batches use AttentionHealth.
    """
    B, H, L, K = attention.weights.shape
    allowed = allowed_keys(attention.blocked, K, attention.weights.device)
    counted = counted_rows(allowed, key_padding_mask).expand(B, H, L)
    per_row = row_normalized_entropy(attention.weights, allowed)
    return (per_row * counted).sum(dim=(0, 2)) / counted.sum(dim=(0, 2))


@dataclass
class HealthFigures:
    """The figures of one validation pass (see the module docstring); each (n_layers, H) unless said otherwise.
    A pruned network's missing heads are NaN."""

    entropy: torch.Tensor
    max_weight: torch.Tensor
    score_std: torch.Tensor
    rows: int  # counted query rows behind each figure
    weight_sample: torch.Tensor  # (n_layers, H, ≤ sample_size) weights drawn uniformly from counted pairs
    heads: list[int] | None = None  # heads of each layer when a pruned network's layers differ
    distance: torch.Tensor | None = None
    gradient_pass: torch.Tensor | None = None
    pad_weight: torch.Tensor | None = None
    real_zero_share: torch.Tensor | None = None
    row_sum_error: torch.Tensor | None = None
    future_zero_share: torch.Tensor | None = None
    future_weight: torch.Tensor | None = None
    head_similarity: torch.Tensor | None = None  # (n_layers, H, H)
    score_correlation: torch.Tensor | None = None  # (n_layers, H, H)
    padded_rows: int = 0  # counted rows of texts that had padding (the pad figures' evidence)

    def heads_of(self, layer: int) -> int:
        return self.heads[layer] if self.heads else self.entropy.shape[1]

    def head(self, layer: int, head: int) -> dict[str, float]:
        """The per-head figures of one head, by name (NaN for a figure this kind has not)."""
        names = ("entropy", "max_weight", "score_std", "gradient_pass", "distance", "pad_weight", "real_zero_share",
                 "row_sum_error", "future_zero_share", "future_weight")
        values = {name: getattr(self, name) for name in names}
        return {name: math.nan if value is None else float(value[layer, head]) for name, value in values.items()}


class AttentionHealth:
    """Accumulates attention figures over the batches of a validation pass; `compute()` gives HealthFigures.

    Sums live in float64 on the device of the first batch. At most `rows_per_batch` counted rows of a batch are
    read (None: all of them; see the module docstring). `causal`: the config's look-ahead flag, which says which
    keys a query should see. The histogram sample is a uniform sample without replacement of the weights of the
    rows read (each weight gets a random key, the smallest `sample_size` keys stay).
    """

    def __init__(self, sample_size: int = 4096, seed: int = 0, rows_per_batch: int | None = ROWS_PER_BATCH,
                 causal: bool = False):
        if rows_per_batch is not None and rows_per_batch < 1:
            raise ValueError(f"rows_per_batch must be >= 1 or None, got {rows_per_batch}")
        self.sample_size, self.seed, self.rows_per_batch, self.causal = sample_size, seed, rows_per_batch, causal
        self.reset()

    def reset(self) -> None:
        self.sums = None  # name → (n_layers, H) float64 (ROW_SUMS, squared_deviation), or (n_layers, H, H)
        self.heads = None  # heads of each layer
        self.rows, self.pairs, self.padded_rows = 0, 0.0, 0.0  # counted rows; allowed pairs; rows of padded texts
        self.rows_read = 0
        self.virtual = False  # linformer: no key is a token
        self.sample = self.sample_keys = None  # (n_layers, H, ≤ sample_size)
        self.generator = None

    @torch.no_grad()
    def update(self, attention: Sequence[AttentionWeights], key_padding_mask: torch.Tensor | None = None) -> None:
        """attention: one AttentionWeights per layer, in its kind's own key layout, as the network handed them out
        for this batch (`model(ids, key_padding_mask, need_weights=True).attention`); all layers share one mask.
        key_padding_mask (B, L) bool, True at padding, as the data module made it from the texts' lengths."""
        weights = attention[0].weights
        B, _, L, _ = weights.shape
        if self.sums is None:
            # A pruned network's layers may have different head counts: figures are (n_layers, most heads).
            self.heads = [layer.weights.shape[1] for layer in attention]
            n, most = len(attention), max(self.heads)
            self.sums = {name: torch.zeros(n, most, dtype=torch.float64, device=weights.device)
                         for name in (*ROW_SUMS, "squared_deviation")}
            self.sums |= {name: torch.zeros(n, most, most, dtype=torch.float64, device=weights.device)
                          for name in PAIR_SUMS}
            self.generator = torch.Generator(device=weights.device).manual_seed(self.seed)
        if key_padding_mask is None:
            key_padding_mask = torch.zeros(B, L, dtype=torch.bool, device=weights.device)
        lengths = (~key_padding_mask.bool()).sum(dim=-1)  # (B,) padding comes last
        positions = attention[0].key_positions
        global_rows = [layer.global_rows for layer in attention]
        g = 0 if global_rows[0] is None else global_rows[0].weights.shape[2]
        self.update_rows(attention, lengths, L, positions, first_query=g)
        if g:  # the sparse kind's global queries, over all L keys
            self.update_rows(global_rows, lengths, g, None)

    def update_rows(self, attention: Sequence[AttentionWeights], lengths: torch.Tensor, n_queries: int,
                    positions: torch.Tensor | None, first_query: int = 0) -> None:
        """Adds one set of query rows, (B, H, n_queries, K) per layer, sharing one mask and one key layout:
        positions (L, K) the token of each column (None: column = token; −1 everywhere: projected keys)."""
        B, H, _, K = attention[0].weights.shape
        device = attention[0].weights.device
        query = torch.arange(n_queries, device=device)  # (L,)
        if positions is None:
            keys = torch.arange(K, device=device).expand(n_queries, K)  # (L, K)
        else:
            keys = positions.to(device)[:n_queries]
        virtual = bool((keys < 0).all())
        self.virtual |= virtual
        real_key = (keys >= 0)[None] & (keys[None] < lengths[:, None, None])  # (B, L, K) by the batch's lengths
        if virtual:
            real_key = torch.ones(B, n_queries, K, dtype=torch.bool, device=device)
        # A token may fill two columns (sparse: a global key inside the band): count each key once.
        order = keys.sort(dim=-1)
        repeat = torch.zeros_like(keys, dtype=torch.bool).scatter_(
            -1, order.indices[:, 1:], order.values[:, 1:] == order.values[:, :-1])  # (L, K)
        distinct = real_key if virtual else real_key & ~repeat
        should_see = distinct & (keys <= query[:, None]) if self.causal else distinct  # (B, L, K)
        # A row the layer lets see a single key has no choice to make (a kind may narrow what a query sees); a row
        # it lets see none, while the batch says it should see two, is counted: a mask that blocks everything.
        allowed = allowed_keys(attention[0].blocked, K, device)
        allowed = allowed.expand(*allowed.shape[:-1], K)  # a mask broadcast along the keys (B, 1, L, 1) holds K each
        choices = allowed.sum(dim=-1)[:, 0].expand(B, n_queries)  # (B, L)
        counted = (query < lengths[:, None]) & (query >= first_query) & (should_see.sum(dim=-1) >= 2) \
            & (choices != 1)  # (B, L)
        batch_index, query_index = counted.nonzero(as_tuple=True)  # (R,) each
        total = len(batch_index)
        if total == 0:
            return
        if self.rows_per_batch is not None and total > self.rows_per_batch:
            pick = torch.randperm(total, generator=self.generator, device=device)[: self.rows_per_batch]
            batch_index, query_index = batch_index[pick], query_index[pick]
        share = total / len(batch_index)  # counted rows each row read stands for
        row_allowed = allowed.expand(B, 1, n_queries, K)[batch_index, 0, query_index]  # (R, K)
        n_keys = row_allowed.sum(dim=-1, keepdim=True)  # (R, 1)
        row_keys = keys[query_index]  # (R, K)
        real = real_key[batch_index, query_index].double()  # (R, K)
        later = real * (row_keys > query_index[:, None])  # (R, K) later real keys
        has_later = later.sum(dim=-1) > 0  # (R,)
        padded = (lengths[batch_index] < lengths.max()).double()  # (R,) rows of texts that have padding
        distance = (row_keys - query_index[:, None]).abs().double()  # (R, K); meaningless for projected keys
        add = {}
        for layer, part in enumerate(attention):
            # Rows first: (B, H, L, K)[b, :, i] with R pairs (b, i) → (R, H, K); only these are read.
            w = part.weights[batch_index, :, query_index].double()  # (R, H, K)
            s = part.scores[batch_index, :, query_index].double()  # (R, H, K)
            h = w.shape[1]
            on_real = (w * real[:, None]).sum(dim=-1)  # (R, H)
            squares = w.square().sum(dim=-1)  # (R, H)
            n = n_keys.clamp(min=2).double()  # (R, 1)
            add = {
                "entropy": row_normalized_entropy(w, row_allowed[:, None]),
                "max_weight": w.amax(dim=-1),
                "gradient_pass": (1 - squares) / (1 - 1 / n),
                "distance": (w * distance[:, None]).sum(dim=-1),
                "pad_weight": (w * (1 - real)[:, None]).sum(dim=-1),
                "real_zero": (on_real == 0).double(),
                "row_sum_error": (w.sum(dim=-1) - 1).abs(),
                "future_weight": (w * later[:, None]).sum(dim=-1),
                "future_zero": ((w * later[:, None]).sum(dim=-1) == 0).double() * has_later[:, None],
                "future_rows": has_later[:, None].double().expand(-1, h),
            }
            for name, per_row in add.items():
                self.sums[name][layer, :h] += share * per_row.sum(dim=0)
            pairs = row_allowed[:, None].to(s.dtype)  # (R, 1, K)
            row_mean = (s * pairs).sum(dim=-1, keepdim=True) / n_keys.clamp(min=1)[:, None]  # (R, H, 1)
            centred = (s - row_mean) * pairs  # (R, H, K), 0 at blocked keys
            self.sums["squared_deviation"][layer, :h] += share * centred.square().sum(dim=(0, 2))
            self.sums["score_products"][layer, :h, :h] += share * torch.einsum("rhk,rgk->hg", centred, centred)
            difference = (w[:, :, None] - w[:, None]).abs().sum(dim=-1)  # (R, H, H)
            self.sums["head_similarity"][layer, :h, :h] += share * (1 - difference / 2).sum(dim=0)
        self.rows += total
        self.rows_read += len(batch_index)
        self.pairs += share * int(row_allowed.sum())
        self.padded_rows += share * float(padded.sum())
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
        nan = math.nan
        sums = {name: value.cpu() for name, value in self.sums.items()}
        rows = self.rows or nan
        future_rows = sums["future_rows"].masked_fill(sums["future_rows"] == 0, nan)
        figures = {
            "entropy": sums["entropy"] / rows,
            "max_weight": sums["max_weight"] / rows,
            "score_std": (sums["squared_deviation"] / (self.pairs or nan)).sqrt(),
            "gradient_pass": sums["gradient_pass"] / rows,
            "distance": sums["distance"] / rows,
            "pad_weight": sums["pad_weight"] / rows,
            "real_zero_share": sums["real_zero"] / rows,
            "row_sum_error": sums["row_sum_error"] / rows,
            "future_zero_share": sums["future_zero"] / future_rows,
            "future_weight": sums["future_weight"] / rows,
        }
        if self.virtual:  # projected keys are no token: no padding, no order among them
            for name in ("pad_weight", "real_zero_share", "future_zero_share", "future_weight", "distance"):
                figures[name] = torch.full_like(figures[name], nan)
        if not self.causal:
            figures["future_weight"] = torch.full_like(figures["future_weight"], nan)
        else:
            figures["future_zero_share"] = torch.full_like(figures["future_zero_share"], nan)
        missing = torch.arange(max(self.heads)) >= torch.tensor(self.heads)[:, None]  # (n_layers, H) pruned heads
        products = sums["score_products"]
        diagonal = products.diagonal(dim1=-2, dim2=-1)  # (n_layers, H)
        correlation = products / (diagonal[:, :, None] * diagonal[:, None, :]).sqrt()
        pair_missing = missing[:, :, None] | missing[:, None, :]
        nothing = torch.zeros(*sums["entropy"].shape, 0)  # no counted row at all: an empty sample
        return HealthFigures(
            **{name: value.masked_fill(missing, nan).float() for name, value in figures.items()},
            rows=self.rows,
            weight_sample=(self.sample if self.sample is not None else nothing).cpu(),
            heads=self.heads if len(set(self.heads)) > 1 else None,
            head_similarity=(sums["head_similarity"] / rows).masked_fill(pair_missing, nan).float(),
            score_correlation=correlation.masked_fill(pair_missing, nan).float(),
            padded_rows=round(self.padded_rows),
        )
