"""Attention for long texts, written out as matrices like model/attention.py: three kinds that never build L × L.

    local      S_i = q_i [k_{i-w} … k_{i+w}]ᵀ · scale     each token sees the w tokens on each side      O(L·w)
               (causal: [k_{i-w} … k_i], the w tokens before it and itself)
    linformer  K' = E K,  V' = F V  (k × d per head)      S = Q K'ᵀ · scale, out = softmax(S) V'          O(L·k)
               E, F (k × max_length) are learned and shared by all heads; padded keys and values are zeroed
               before projecting, so padding contributes nothing to K' and V'
    sparse     local, plus the first g tokens as global tokens: every token sees them, they see every token
                                                                                                          O(L·(w+g))

Each kind is a MultiHeadSelfAttention: the same W_Q, W_K, W_V, W_O, the same 1/√d scale, reached through the same
forward() and forward_packed(), and the same formula: each kind's `attend` only chooses which keys and values a
query sees and lays out their `blocked` places, then calls model/attention.py's `attention()` on them (looked up at
call time as `core.attention`, so an edit there reaches every kind). `mask` hands attend the padding mask itself.

Local attention is computed by blocks (lucidrains/local-attention): the sequence is cut into blocks of w tokens,
and each block of queries scores its own block and the one before it (and after it): (B, H, n, w, 3w). Nothing of
size L × L is ever made, so time and memory grow as L·w.

What a layer hands out (model/attention.py's `AttentionWeights`), in the kind's own key layout, K keys per query
row:
    local      (B, H, L, 2w+1), column o of row i is key i − w + o      causal: (B, H, L, w+1), the same formula
    linformer  (B, H, L, k), column r is the projected ("virtual") key r: row r of E K
    sparse     (B, H, L, g + 2w+1): columns 0..g-1 the global keys, then the band as for local; the g global query
               rows are handed out apart, over all L keys, as `global_rows` (B, H, g, L) (as Longformer's
               global_attentions); their rows in the main layout are blocked
its `key_positions` (L, K) names the token each column is (−1 for a virtual key); monitor/views.py's `token_window`
turns any hand-out into a token × token matrix for a short window of the text, for heatmaps and explanations.

Letters in the shape comments: B batch, L tokens, H heads, d head size, w window, n blocks of w tokens,
C blocks of keys per block of queries (3, or 2 with the look-ahead mask), k projection length, g global tokens.
"""

import math
import torch
import torch.nn.functional as F
from torch import nn

import model.attention as core
from model.attention import AttentionWeights, MultiHeadSelfAttention
from model.errors import ConfigError


class LongAttention(MultiHeadSelfAttention):
    """What the three kinds share: no fused kernel (it computes L × L), the padding mask handed to attend, whole
    long texts read, and an output that depends on which tokens are near each other even without positions."""

    length_cap = 2048  # they cost L·w, L·k or L·(w+g), not L²: whole long texts

    @classmethod
    def order_blind(cls, config) -> bool:
        return False

    @classmethod
    def check(cls, config) -> None:
        if config.attention_kernel != "manual":
            raise ConfigError(f"attention_kernel {config.attention_kernel} applies to attention: full only, "
                              f"not {config.attention} (use attention_kernel: manual)")

    @staticmethod
    def at_most_max_length(config, name: str, why: str = "") -> None:
        """A size a kind reads off the text (a window, global tokens, projected rows) may not exceed max_length."""
        value = getattr(config, name)
        if value > config.max_length:
            raise ConfigError(f"{name} {value} is larger than max_length {config.max_length}{why}")

    def mask(self, key_padding_mask: torch.Tensor | None, L: int, device=None) -> torch.Tensor | None:
        """(B, L) bool, True at padding, or None: each kind builds its own blocked places from it."""
        return None if key_padding_mask is None else key_padding_mask.bool()


# ---- local ------------------------------------------------------------------------------------------------------


class LocalSelfAttention(LongAttention):
    summary = "the `window` tokens on each side (before it, with causal), computed by blocks, O(L·w)"
    doc_settings = "`window` w"
    doc_computes = ("softmax(q_i [k_{i−w} … k_{i+w}]ᵀ · scale) [v_{i−w} … v_{i+w}]; with `causal` the w keys before i "
                    "and i itself")
    doc_cost = "O(L·w), by blocks of w tokens: nothing L × L is ever made"
    doc_weights = "(B, H, L, 2w+1) (causal: w+1), column o of row i is token i − w + o"
    least = {"window": 1}

    @classmethod
    def check(cls, config) -> None:
        super().check(config)
        cls.at_most_max_length(config, "window", ": a block of w queries scores 3w keys whatever the text's length "
                               f"(use window <= {config.max_length})")

    @classmethod
    def settings(cls, config) -> dict:
        return {"window": config.window}

    def __init__(self, *, window: int, **kwargs):
        super().__init__(**kwargs)
        self.window = window

    @property
    def band_width(self) -> int:
        """Columns of the handed-out band: the w keys before, the query itself, and (without causal) the w after."""
        return self.window + 1 if self.causal else 2 * self.window + 1

    def attend(self, q, k, v, padding, need_weights: bool = False):
        """Each block of w queries sees its own block of keys and the one before it (and after it), minus what
        lies outside a query's window. q, k, v (B, H, L, d); padding (B, L) bool or None.
        Returns (out (B, H, L, d), AttentionWeights or None)."""
        L = q.shape[2]
        keys, values = self.neighbours(self.blocks(k)), self.neighbours(self.blocks(v))  # each (B, H, n, C·w, d)
        blocked = self.band_mask(L, padding, q.device)  # (B or 1, 1, n, w, C·w)
        out, block_weights = core.attention(self.blocks(q), keys, values, blocked, scale=self.scale,
                                            dropout=self.dropout, need_weights=need_weights)  # (B, H, n, w, d)
        out = out.flatten(2, 3)[:, :, :L]  # (B, H, L, d)
        if not need_weights:
            return out, None
        band = [self.to_band(t, L) for t in block_weights[:3]]  # weights, scores, blocked: (B or 1, H or 1, L, band)
        return out, AttentionWeights(*band, key_positions=self.key_positions(L, q.device))

    def band_mask(self, L: int, padding, device) -> torch.Tensor:
        """(B or 1, 1, n, w, C·w) bool: True where a block's key slot is outside a query's window (or after the
        query, under the look-ahead mask), past the text's end, or padding."""
        w = self.window
        # Offset of key slot s from query r inside a block row: key (b − 1)·w + s, query b·w + r → s − r − w.
        offset = torch.arange((3 - self.causal) * w, device=device) - torch.arange(w, device=device)[:, None] - w
        outside = (offset < -w) | (offset > (0 if self.look_ahead else w))  # (w, C·w)
        missing = torch.zeros(1, L, dtype=torch.bool, device=device) if padding is None else padding  # (B or 1, L)
        missing = self.neighbours(self.blocks(missing[:, None, :, None], fill=True))  # (B or 1, 1, n, C·w, 1)
        return outside | missing.transpose(-2, -1)  # (B or 1, 1, n, w, C·w)

    def blocks(self, t: torch.Tensor, fill=0) -> torch.Tensor:
        """(B, H, L, d) → (B, H, n, w, d), the last block filled up with `fill` rows."""
        B, H, L, d = t.shape
        n = (L + self.window - 1) // self.window  # not -(-L // w): ONNX divides negative integers toward 0
        t = F.pad(t, (0, 0, 0, n * self.window - L), value=fill)
        return t.view(B, H, n, self.window, d)

    def neighbours(self, t: torch.Tensor) -> torch.Tensor:
        """(B, H, n, w, d) → (B, H, n, C·w, d): each block's previous block, itself (and next block) side by side;
        beyond the ends: zeros, or True for a boolean (missing) tensor."""
        after = 0 if self.causal else 1
        padded = F.pad(t, (0, 0, 0, 0, 1, after), value=t.dtype == torch.bool)  # (B, H, n + C − 1, w, d)
        n = t.shape[2]
        return torch.cat([padded[:, :, i : i + n] for i in range(2 + after)], dim=3)

    def to_band(self, t: torch.Tensor, L: int) -> torch.Tensor:
        """Block layout (…, n, w, C·w) → band layout (…, L, band_width): query r of a block finds key i − w + o at
        slot r + o (see band_mask)."""
        w, width = self.window, self.band_width
        slots = torch.arange(w, device=t.device)[:, None] + torch.arange(width, device=t.device)  # (w, band_width)
        band = t.gather(-1, slots.expand(*t.shape[:-1], width))  # (…, n, w, band_width)
        return band.flatten(-3, -2)[..., :L, :]

    def key_positions(self, L: int, device=None) -> torch.Tensor:
        """(L, band_width): column o of row i is key i − w + o."""
        return torch.arange(L, device=device)[:, None] - self.window + torch.arange(self.band_width, device=device)

    def reference_keys(self, L: int, causal: bool, device=None) -> torch.Tensor:
        """(L, L) bool, the definition: query i sees keys i − w … i + w (causal: i − w … i)."""
        offset = torch.arange(L, device=device) - torch.arange(L, device=device)[:, None]  # key − query
        return (offset <= 0) & (offset >= -self.window) if causal else offset.abs() <= self.window


# ---- sparse -----------------------------------------------------------------------------------------------------


class SparseSelfAttention(LocalSelfAttention):
    """Local attention plus the first g tokens as global tokens (Longformer / BigBird style): every query scores
    the g global keys besides its window, and the g global queries score all L keys."""

    summary = ("local plus the first `global_tokens` tokens, which every token sees and which see every token, "
               "O(L·(w+g))")
    doc_settings = "`window` w, `global_tokens` g"
    doc_computes = "local, plus the first g tokens as global: every token sees them, they see every token (Longformer)"
    doc_cost = "O(L·(w+g))"
    doc_weights = "(B, H, L, g + 2w+1): the g global keys, then the band"
    least = {**LocalSelfAttention.least, "global_tokens": 0}  # 0 global tokens: plain local attention

    @classmethod
    def check(cls, config) -> None:
        super().check(config)
        cls.at_most_max_length(config, "global_tokens")

    @classmethod
    def settings(cls, config) -> dict:
        return {**super().settings(config), "global_tokens": config.global_tokens}

    def __init__(self, *, global_tokens: int, **kwargs):
        super().__init__(**kwargs)
        self.global_tokens = global_tokens

    def attend(self, q, k, v, padding, need_weights: bool = False):
        """Each block of queries sees the g global keys and its window as in local attention; the g global queries
        see all L keys. q, k, v (B, H, L, d); padding (B, L) bool or None.
        Returns (out (B, H, L, d), AttentionWeights or None)."""
        L = q.shape[2]
        g = min(self.global_tokens, L)
        n, w = (L + self.window - 1) // self.window, self.window
        # Each block's keys: the g global keys, then its neighbouring blocks as in local attention.
        keys = torch.cat([k[:, :, None, :g].expand(-1, -1, n, -1, -1), self.neighbours(self.blocks(k))], dim=3)
        values = torch.cat([v[:, :, None, :g].expand(-1, -1, n, -1, -1), self.neighbours(self.blocks(v))], dim=3)
        # (B, H, n, g + C·w, d) each. A global key inside a query's window has its own column: blocked in the band.
        band_key = (torch.arange(n, device=q.device)[:, None] - 1) * w + torch.arange(keys.shape[3] - g, device=q.device)
        band_blocked = self.band_mask(L, padding, q.device) | (band_key < g)[:, None, :]  # (B or 1, 1, n, w, C·w)
        global_blocked = self.blocks(self.global_mask(padding, n * w, g, q.device))  # (B or 1, 1, n, w, g)
        batch = max(global_blocked.shape[0], band_blocked.shape[0])
        blocked = torch.cat([global_blocked.expand(batch, -1, -1, -1, -1), band_blocked.expand(batch, -1, -1, -1, -1)],
                            dim=-1)  # (B or 1, 1, n, w, g + C·w)
        out, block_weights = core.attention(self.blocks(q), keys, values, blocked, scale=self.scale,
                                            dropout=self.dropout, need_weights=need_weights)  # (B, H, n, w, d)

        # The global queries: g rows of full attention over all L keys, O(g·L).
        rows_blocked = self.global_mask(padding, g, L, q.device)  # (B or 1, 1, g, L)
        rows_out, global_rows = core.attention(q[:, :, :g], k, v, rows_blocked, scale=self.scale,
                                               dropout=self.dropout, need_weights=need_weights)  # (B, H, g, d)
        out = torch.cat([rows_out, out.flatten(2, 3)[:, :, g:L]], dim=2)  # (B, H, L, d)
        if not need_weights:
            return out, None

        weights, scores, blocked = (self.to_band(t, L) for t in block_weights[:3])  # each (…, L, g + band_width)
        is_global = (torch.arange(L, device=q.device) < g)[:, None]  # (L, 1): rows handed out in global_rows
        weights, blocked = weights.masked_fill(is_global, 0.0), blocked | is_global
        return out, AttentionWeights(weights, scores, blocked, self.key_positions(L, q.device), global_rows)

    def global_mask(self, padding, queries: int, keys: int, device) -> torch.Tensor:
        """(B or 1, 1, queries, keys) bool, True where query p may not see key j: j is padding, or comes after p under
        the look-ahead mask. For the global columns (all queries × g keys) and the global rows (g queries × L keys)."""
        blocked = torch.zeros(1, 1, queries, keys, dtype=torch.bool, device=device)
        if padding is not None:
            blocked = blocked | padding[:, None, None, :keys]  # (B, 1, queries, keys)
        if self.look_ahead:
            blocked = blocked | (torch.arange(keys, device=device) > torch.arange(queries, device=device)[:, None])
        return blocked

    def to_band(self, t: torch.Tensor, L: int) -> torch.Tensor:
        """Block layout (…, n, w, g + C·w) → (…, L, g + band_width): the g global columns, then the band."""
        g = t.shape[-1] - (3 - self.causal) * self.window
        return torch.cat([t[..., :g].flatten(-3, -2)[..., :L, :], super().to_band(t[..., g:], L)], dim=-1)

    def key_positions(self, L: int, device=None) -> torch.Tensor:
        """(L, g + band_width): the global keys 0..g-1, then the band (column o: key i − w + o)."""
        g = min(self.global_tokens, L)
        return torch.cat([torch.arange(g, device=device).expand(L, g), super().key_positions(L, device)], dim=-1)

    def reference_keys(self, L: int, causal: bool, device=None) -> torch.Tensor:
        """(L, L) bool, the definition: the window as for local, plus every key of a global query and the global
        keys for every query (causal: none after the query)."""
        index = torch.arange(L, device=device)
        seen = super().reference_keys(L, False, device) | (index < self.global_tokens)[:, None] \
            | (index < self.global_tokens)[None, :]
        return seen & (index[None, :] <= index[:, None]) if causal else seen


# ---- linformer --------------------------------------------------------------------------------------------------


class LinformerSelfAttention(LongAttention):
    """Keys and values projected along the length to k rows: K' = E K, V' = F V (Wang et al. 2020, "Linformer").

    E and F (k × max_length) are learned, one pair shared by all heads and all texts (the paper's headwise
    sharing); a batch of L tokens uses their first L columns. Padded keys and values are zeroed before projecting,
    so a padded position contributes nothing to K' and V' and padding changes no real token's output. There is no
    look-ahead mask: each virtual key mixes the whole text, future tokens included.
    """

    summary = "keys and values projected along the length to `projection_length` rows, O(L·k), no causal"
    doc_settings = "`projection_length` k"
    doc_computes = ("K′ = E K, V′ = F V (E, F: k × max_length, learned, shared by all heads); softmax(q_i K′ᵀ · scale) "
                    "V′; padded keys and values are zeroed before projecting")
    doc_cost = "O(L·k)"
    doc_weights = "(B, H, L, k) over the k projected \"virtual\" keys"
    keys_are_tokens = False
    least = {"projection_length": 1}

    @classmethod
    def check(cls, config) -> None:
        super().check(config)
        cls.at_most_max_length(config, "projection_length", ": there are not that many tokens to project")
        if config.causal:
            raise ConfigError("causal: true with attention: linformer is not meaningful: each projected key mixes "
                              "every token, future ones included (use local or sparse)")

    @classmethod
    def settings(cls, config) -> dict:
        return {"projection_length": config.projection_length, "max_length": config.max_length}

    @classmethod
    def extra_parameters(cls, config) -> int:
        return 2 * config.projection_length * config.max_length  # E and F

    def __init__(self, *, projection_length: int, max_length: int, **kwargs):
        super().__init__(**kwargs)
        # Entries N(0, 1/k), as the paper's random projections; learned from there.
        self.key_projection = nn.Parameter(torch.randn(projection_length, max_length) / math.sqrt(projection_length))
        self.value_projection = nn.Parameter(torch.randn(projection_length, max_length) / math.sqrt(projection_length))

    def attend(self, q, k, v, padding, need_weights: bool = False):
        """Every query sees the k projected keys and values. q, k, v (B, H, L, d); padding (B, L) bool or None.
        Returns (out (B, H, L, d), AttentionWeights or None)."""
        L = q.shape[2]
        blocked = None
        if padding is not None:
            real = ~padding[:, None, :, None]  # (B, 1, L, 1)
            k, v = k * real, v * real  # padded positions contribute nothing to E K and F V
            # A text of padding only has no key at all: all k virtual keys blocked, its queries give 0.
            blocked = padding.all(dim=-1)[:, None, None, None].expand(-1, -1, -1, self.key_projection.shape[0])
        k = self.key_projection[:, :L] @ k  # (k, L) @ (B, H, L, d) → (B, H, k, d)
        v = self.value_projection[:, :L] @ v  # (B, H, k, d)
        out, weights = core.attention(q, k, v, blocked, scale=self.scale, dropout=self.dropout,
                                      need_weights=need_weights)  # (B, H, L, d), weights over the k virtual keys
        if not need_weights:
            return out, None
        virtual = torch.full((L, k.shape[2]), -1, dtype=torch.long, device=q.device)  # (L, k): no token
        return out, weights._replace(key_positions=virtual)

    def reference_keys_values(self, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor, causal: bool):
        """The definition: K' = E K and V' = F V over the text's real tokens (padding zeroed before projecting), each
        query seeing all k of them; a text of padding only has no key."""
        L, real = k.shape[-2], ~padding[:, None, :, None]
        keys = self.key_projection[:, :L].to(k.dtype) @ (k * real)  # (B, H, k, d)
        values = self.value_projection[:, :L].to(v.dtype) @ (v * real)
        allowed = (~padding.all(dim=-1))[:, None, None, None].expand(-1, 1, L, keys.shape[2])
        return keys, values, allowed
