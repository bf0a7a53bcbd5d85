"""Token × token views of what any attention kind hands out, for heatmaps (monitor/heatmap.py) and explanations
(inference/explain.py). Plain PyTorch: no matplotlib, no Lightning.

A long kind hands out its weights in its own key layout (model/long_attention.py: column c of row i is token
key_positions[i, c], −1 for linformer's projected keys); these turn any of them into the weight query i puts on
token j, for a short window of the text, and `stacked_layers` stacks every layer's hand-out for figures and
predictions.
"""

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch
import torch.nn.functional as F

from model.attention import AttentionWeights


def dense_window(
    weights: torch.Tensor, key_positions: torch.Tensor, start: int, size: int, global_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """A kind's layout (…, L, K) → the token × token matrix (…, m, m) of tokens start..start+m-1, m = min(size,
    L − start): row i, column j is the weight query i puts on key j; keys outside the window are left out.
    global_weights (…, g, L): the sparse kind's global rows, written over rows 0..g-1. Virtual keys (linformer):
    (…, m, K), the rows only."""
    L = weights.shape[-2]
    m = max(0, min(size, L - start))
    rows = weights[..., start : start + m, :]  # (…, m, K)
    positions = key_positions[start : start + m]  # (m, K)
    if (positions < 0).all():
        return rows
    key = positions - start  # (m, K): column in the window
    inside = (key >= 0) & (key < m)
    dense = rows.new_zeros(*rows.shape[:-1], m)  # (…, m, m)
    dense.scatter_add_(-1, key.clamp(0, max(m - 1, 0)).expand_as(rows), rows * inside)
    if global_weights is not None:
        top = min(global_weights.shape[-2], start + m) - start  # global rows inside the window
        if top > 0:
            dense[..., :top, :] = global_weights[..., start : start + top, start : start + m]
    return dense


def token_window(attention: AttentionWeights, start: int, size: int) -> torch.Tensor:
    """Any layer's hand-out (B, H, L, K) in its own key layout → (B, H, m, m) over tokens start..start+m-1 (see
    dense_window); full attention is simply cut; linformer gives (B, H, m, k)."""
    if attention.key_positions is None:
        return attention.weights[..., start : start + size, start : start + size]
    global_rows = attention.global_rows.weights if attention.global_rows is not None else None
    return dense_window(attention.weights, attention.key_positions, start, size, global_rows)


class StackedLayers(NamedTuple):
    """Every layer's hand-out as one tensor each, on the CPU, for figures and predictions."""

    weights: torch.Tensor  # (B, n_layers, H, L, K) float; a pruned layer's missing heads are NaN rows
    key_positions: torch.Tensor | None  # (L, K): the token of each column (None: column j is token j)
    global_weights: torch.Tensor | None  # (B, n_layers, H, g, L): sparse's global rows; None for other kinds


def stacked_layers(layers: Sequence[AttentionWeights]) -> StackedLayers:
    """The layers' hand-outs (model(..., need_weights=True).attention) stacked along a layer axis after the batch;
    layers with fewer heads (a pruned network) are filled up with NaN heads, drawn as blank panels."""
    most = max(layer.weights.shape[1] for layer in layers)

    def stack(tensors):  # each (B, H, rows, K) → (B, n_layers, most, rows, K)
        return torch.stack([F.pad(t.float(), (0, 0, 0, 0, 0, most - t.shape[1]), value=math.nan) for t in tensors],
                           dim=1).cpu()

    first = layers[0]
    keys = None if first.key_positions is None else first.key_positions.cpu()
    global_weights = None if first.global_rows is None else stack([layer.global_rows.weights for layer in layers])
    return StackedLayers(stack([layer.weights for layer in layers]), keys, global_weights)
