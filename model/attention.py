"""Multi-head self-attention written out as matrices, the way the textbook formula reads.

    Q = X W_Q    K = X W_K    V = X W_V
    A = softmax(Q Kᵀ / √d)          each row sums to 1; blocked keys get exactly 0
    out = concat_heads(A V) W_O

`attention()` below holds those lines once. Every kind calls it: `full` (here) on all L keys, and `local`,
`sparse` and `linformer` (model/long_attention.py) on the keys and values they choose for each query, so an edit of
`attention()` reaches training, validation, the monitor, heatmaps and prediction for every kind.
`attention_kernel="fused"` is an opt-in for `full` only that gives the same numbers through torch's
scaled_dot_product_attention (tests/test_attention.py proves them equal).

Letters in the shape comments: B batch, L tokens, H heads, d head size, D model width, N real tokens of a batch,
K keys a query row is scored against (L for full attention; a long kind's own layout otherwise).
"""

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model.kind import Kind


class AttentionWeights(NamedTuple):
    """What a layer hands out when asked for its weights: exactly what it computed, for the monitor and heatmaps.

    Full attention hands out (B, H, L, L): column j is token j. A long kind (model/long_attention.py) hands out its
    own layout (B, H, L, K) and says where each column's key lies in `key_positions`; monitor/views.py reads both.
    """

    weights: torch.Tensor  # (B, H, L, K) softmax rows: query × key; blocked keys hold exactly 0
    scores: torch.Tensor  # (B, H, L, K) the pre-softmax scores Q Kᵀ · scale (blocked places hold a huge negative)
    blocked: torch.Tensor | None  # broadcasts to (B, H, L, K); True where a query may not look at a key
    key_positions: torch.Tensor | None = None  # (L, K) long: the token of column c in row i, −1 for a projected key;
    # None: column j is token j (K = L)
    global_rows: "AttentionWeights | None" = None  # sparse: its g global queries over all L keys, (B, H, g, L)


def attention(q, k, v, blocked=None, *, scale: float, dropout: nn.Module | None = None, need_weights: bool = False,
              bias: torch.Tensor | None = None):
    """The formula, written once: softmax(q kᵀ · scale) v, with blocked keys at exactly 0.

    q (…, L, d) queries; k, v (…, K, d) the keys and values they see; blocked broadcasts to (…, L, K), True where a
    query may not look at a key (None: none blocked). The leading dimensions (…) are (B, H) for full attention, or (B,
    H, blocks) when a long kind scores block by block. bias: a finite float added to the scores (a user's class calling
    F.scaled_dot_product_attention with a float attn_mask, model/own_attention/weights_seen.py); no built-in kind gives
    one. Returns (out (…, L, d), AttentionWeights or None).
    """
    # The scale multiplies the fresh product in place: no second (…, L, K) tensor, and autograd keeps neither.
    scores = (q @ k.transpose(-2, -1)).mul_(scale)  # (…, L, K)
    if bias is not None:
        scores = scores + bias
    if blocked is not None:
        # Blocked keys get half the most negative finite number added rather than -inf: exp() of the sum is
        # exactly 0 next to any allowed key, and a row with no allowed key at all stays finite (uniform; zeroed
        # below). Half, so that adding a score can never overflow to -inf. Added as one float mask, in place:
        # several times faster than a boolean masked_fill, and the scaled product is a fresh tensor that autograd
        # does not keep.
        lowest = torch.finfo(scores.dtype).min / 2
        scores += torch.zeros(blocked.shape, dtype=scores.dtype, device=scores.device).masked_fill_(blocked, lowest)
    # When nobody reads the scores afterwards (not handed out, no gradient through them) the weights overwrite
    # them: the same numbers, without a second (…, L, K) tensor (at 512 tokens a fresh one, 64 MB for a batch
    # of 16, costs more in page faults than the softmax itself).
    keep = need_weights or scores.requires_grad
    weights = torch.softmax(scores, dim=-1, out=None if keep else scores)  # (…, L, K), each row sums to 1
    out = (weights if dropout is None else dropout(weights)) @ v  # (…, L, d)
    if blocked is not None:
        # A query with no key to look at (a text of padding only, a padded query whose window is all padding)
        # gives 0, not an average. Always applied, never behind an `if empty.any()`: no data-dependent branch, so
        # a traced export (ONNX) keeps it; it costs one pass over out, small next to the scores.
        empty = blocked.all(dim=-1, keepdim=True)  # (…, L, 1)
        out = out.masked_fill_(empty, 0.0)  # in place: the product is fresh and its backward does not read it
        if need_weights:
            weights = weights.masked_fill(empty, 0.0)
    return out, AttentionWeights(weights, scores, blocked) if need_weights else None


# The scores one slice of an inference pass holds (MultiHeadSelfAttention.attend): about what a core's L2 cache
# holds. At 512 tokens 1, 2 and 4 MB measured alike and faster than 16 MB or no slicing (docs/RESULTS.md "Speed").
SLICE_BYTES = 4 << 20


class MultiHeadSelfAttention(Kind, nn.Module):
    """Full attention, the "full" kind (model/kinds.py): every query sees all L keys."""

    summary = "every token, O(L²)"  # what a query sees, for --help (model/kinds.py)
    # The README's row of the kind (`make docs`): its settings, what a query i computes, the cost, the weights' layout
    doc_settings = ""
    doc_computes = "softmax(q_i Kᵀ · scale) V over all L keys"
    doc_cost = "O(L²)"
    doc_weights = "(B, H, L, L), column j is token j"
    # Its other answers (keys_are_tokens, length_cap, order_blind, ...) are model/kind.py's defaults.

    def __init__(
        self,
        *,
        d_model: int,
        n_heads: int,
        d_head: int | None = None,
        dropout: float = 0.0,
        bias: bool = False,
        scale: float | None = None,
        causal: bool = False,
        kernel: str = "manual",
    ):
        super().__init__()
        d_head = d_head or d_model // n_heads
        if d_head < 1:
            raise ValueError(f"d_head must be >= 1, got d_model={d_model}, n_heads={n_heads}")
        if kernel not in ("manual", "fused"):
            raise ValueError(f"kernel must be 'manual' or 'fused', got {kernel!r}")
        self.n_heads, self.d_head, self.causal, self.kernel = n_heads, d_head, causal, kernel
        # Whether each query's later keys are blocked (the look-ahead mask). `causal` sets it; a kind may also lay
        # its keys out for causal (local drops the block after), which this alone does not change.
        self.look_ahead = causal
        # 1/√d keeps the dot products at unit variance whatever the head size; a float overrides it
        # (scale=1.0 reproduces "no scaling", which saturates the softmax for large d).
        self.scale = 1.0 / math.sqrt(d_head) if scale is None else float(scale)
        inner = n_heads * d_head
        self.w_q = nn.Linear(d_model, inner, bias=bias)
        self.w_k = nn.Linear(d_model, inner, bias=bias)
        self.w_v = nn.Linear(d_model, inner, bias=bias)
        self.w_o = nn.Linear(inner, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)
        # (H,) multiplies each head's output before W_O when set: head importance (its gradient) and ablation
        # (a 0) in inference/heads.py. Not a parameter: None in training, and never in the checkpoint.
        self.head_gate: torch.Tensor | None = None

    def attend(self, q, k, v, blocked, need_weights: bool = False):
        """Full attention: every query sees all L keys but the blocked ones. q, k, v (B, H, L, d); blocked
        broadcasts to (B, H, L, L), True = may not look. Returns (out (B, H, L, d), AttentionWeights or None)."""
        if self.kernel == "fused" and not need_weights:  # the opt-in; weights are only ever handed out by attention()
            return fused_attention(q, k, v, blocked, self.scale, self.dropout.p if self.training else 0.0), None
        B, H, L, _ = q.shape
        per = max(1, SLICE_BYTES // (H * L * k.shape[-2] * q.element_size()))  # texts a slice holds
        sliced = per < B and not (need_weights or self.training or torch.is_grad_enabled()
                                  or torch.compiler.is_compiling() or torch.jit.is_tracing())
        if not sliced:
            return attention(q, k, v, blocked, scale=self.scale, dropout=self.dropout, need_weights=need_weights)
        # Inference of a large batch: the same formula on slices of texts whose scores stay in the CPU's cache (a
        # fresh (B, H, L, L) tensor is written to memory and read back twice; each text's rows are independent).
        part = lambda t, s: t if t is None or t.shape[0] == 1 else t[s:s + per]  # noqa: E731 (a mask may broadcast)
        return torch.cat([attention(q[s:s + per], k[s:s + per], v[s:s + per], part(blocked, s), scale=self.scale)[0]
                          for s in range(0, B, per)]), None

    def forward(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None, need_weights: bool = False
    ) -> tuple[torch.Tensor, AttentionWeights | None]:
        """x (B, L, D); key_padding_mask (B, L) bool, True marks padding. Returns (out (B, L, D), weights or None)."""
        B, L, _ = x.shape
        # Laid out (3, B, H, L, d), so that q, k and v come out contiguous: the matrix products in attend() then
        # read them as they are instead of copying each.
        q, k, v = self.project(x).permute(2, 0, 3, 1, 4).contiguous()  # each (B, H, L, d)
        out, weights = self.attend(q, k, v, self.mask(key_padding_mask, L, x.device), need_weights)
        return self.w_o(self.merge_heads(self.gated(out))), weights  # (B, L, D)

    def forward_packed(
        self, x: torch.Tensor, key_padding_mask: torch.Tensor, need_weights: bool = False
    ) -> tuple[torch.Tensor, AttentionWeights | None]:
        """forward() for callers that keep padding out of per-token work: x (N, D) holds the N real tokens of a
        (B, L) batch in row-major order, key_padding_mask (B, L) marks padding. Returns (out (N, D), weights or None).

        The projections see only real tokens; the same `attend` sees the (B, L) grid, zeros at padded places.
        Equal to forward() at the real tokens, outputs and gradients (tests/test_attention.py).
        """
        B, L = key_padding_mask.shape
        qkv = self.project(x)  # (N, 3, H, d)
        # Nothing padded (N = B·L, known from the shapes alone): the N rows are the grid itself, read in place as
        # forward() reads them. A compiled or exported graph never takes this branch: there N is known only when
        # the graph runs, and it must hold for padded batches too.
        whole = not torch.compiler.is_compiling() and x.shape[0] == B * L
        if whole:
            q, k, v = qkv.view(B, L, *qkv.shape[1:]).permute(2, 0, 3, 1, 4).contiguous()  # each (B, H, L, d)
        else:
            # One scatter of all three onto the grid: on a CPU, writing the padded grid costs more than projecting.
            # The grid is laid out (3, B, H, L, d) and written through a (B, L, 3, H, d) view, so that q, k and v
            # come out contiguous: the matrix products in attend() then read them as they are instead of copying
            # them. Real places as (row, position) index pairs, not a boolean mask: an exported graph (export.py)
            # then copies whole rows (ONNX ScatterND/GatherND over N pairs) instead of expanding the mask to every
            # element.
            rows, positions = (~key_padding_mask.bool()).nonzero(as_tuple=True)  # (N,) each
            grid = qkv.new_zeros(3, B, self.n_heads, L, self.d_head)  # qkv's dtype: bfloat16 under autocast
            grid.permute(1, 3, 0, 2, 4)[rows, positions] = qkv
            q, k, v = grid  # each (B, H, L, d), zeros at padded places
        out, weights = self.attend(q, k, v, self.mask(key_padding_mask, L, x.device), need_weights)
        heads = self.gated(out).transpose(1, 2)  # (B, L, H, d)
        heads = heads.reshape(B * L, -1) if whole else heads[rows, positions].flatten(1)  # (N, H·d)
        return self.w_o(heads), weights  # (N, D)

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """Q = X W_Q, K = X W_K, V = X W_V for x (…, D) as one matrix product with the three weights stacked (one
        pass over x, not three): (…, 3, H, d)."""
        w_qkv = torch.cat([self.w_q.weight, self.w_k.weight, self.w_v.weight])  # (3·H·d, D)
        b_qkv = None if self.w_q.bias is None else torch.cat([self.w_q.bias, self.w_k.bias, self.w_v.bias])
        return F.linear(x, w_qkv, b_qkv).unflatten(-1, (3, self.n_heads, self.d_head))

    def gated(self, out: torch.Tensor) -> torch.Tensor:
        """Each head's output (B, H, L, d) times its gate, when one is set."""
        return out if self.head_gate is None else out * self.head_gate.view(1, -1, 1, 1)

    def mask(self, key_padding_mask: torch.Tensor | None, L: int, device=None) -> torch.Tensor | None:
        """This layer's mask: (B or 1, 1, L or 1, L) bool, True where a query may not look at a key; None if none."""
        return attention_mask(key_padding_mask, self.look_ahead, L, device)

    def split_heads(self, t: torch.Tensor) -> torch.Tensor:
        return split_heads(t, self.n_heads)

    def merge_heads(self, t: torch.Tensor) -> torch.Tensor:
        return merge_heads(t)

    def reference_keys(self, L: int, causal: bool, device=None) -> torch.Tensor:
        """(L, L) bool: True where this kind's definition lets query i see key j (before padding). Full attention:
        every key, or those at or before i with the look-ahead."""
        seen = torch.ones(L, L, dtype=torch.bool, device=device)
        return seen.tril() if causal else seen

    def reference_keys_values(self, k: torch.Tensor, v: torch.Tensor, padding: torch.Tensor, causal: bool):
        """(keys, values, allowed) a query of this kind sees by its definition, for the doctor's dense reference
        (monitor/reference.py): k, v (B, H, L, d) projected from every position, padding (B, L) from the lengths;
        allowed (B, 1, L, K) bool. Here every position's key and value, where reference_keys lets the query see
        it and the key is no padding."""
        allowed = self.reference_keys(k.shape[-2], causal, k.device)[None, None] & ~padding[:, None, None, :]
        return k, v, allowed


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, H·d) → (B, H, L, d): the heads side by side become a dimension of their own."""
    B, L, inner = t.shape
    return t.view(B, L, heads, inner // heads).transpose(1, 2)  # (B, H, L, d)


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    """(B, H, L, d) → (B, L, H·d): the heads' outputs side by side again."""
    B, H, L, d = t.shape
    return t.transpose(1, 2).reshape(B, L, H * d)  # (B, L, H·d)


def attention_mask(
    key_padding_mask: torch.Tensor | None, causal: bool, L: int, device: torch.device | None = None
) -> torch.Tensor | None:
    """Boolean (B or 1, 1, L or 1, L) mask, True where a query may not look at a key; None when nothing is masked."""
    blocked = None
    if key_padding_mask is not None:
        blocked = key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, L): padded keys, for every query
    if causal:
        future = torch.ones(L, L, dtype=torch.bool, device=device).triu(diagonal=1)  # (L, L): keys after the query
        blocked = future[None, None] if blocked is None else blocked | future
    return blocked


def unpack(t: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """(N, C) real tokens → (B, L, C) with zeros at padding; real (B, L) bool marks the N real places."""
    grid = t.new_zeros(*real.shape, t.shape[-1])
    grid[real.nonzero(as_tuple=True)] = t  # index pairs, not the mask: see forward_packed
    return grid


def fused_attention(q, k, v, blocked, scale: float, dropout_p: float) -> torch.Tensor:
    """The opt-in kernel: softmax(q kᵀ · scale) v through F.scaled_dot_product_attention, with attention()'s
    conventions (a blocked key gets exactly 0; a query with no key to look at gives 0)."""
    if blocked is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
    # An additive float mask (not a boolean one) keeps all-padding rows finite, as in attention().
    bias = torch.zeros(blocked.shape, dtype=q.dtype, device=q.device).masked_fill(blocked, torch.finfo(q.dtype).min)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, scale=scale)
    return out.masked_fill(blocked.all(dim=-1, keepdim=True), 0.0)
