"""Attention as published code writes it (monitor/layer_family.py, model/own_attention/weights_seen.py,
model/own_attention/mask_probe.py, model/own_attention/naming.py): classes copied unchanged from public repositories
(bench/catalogue/user_attention/published/) are taken as they are and judged against their own family, printed as an
identity line; fused kernels are seen through while weights are needed and left alone otherwise; a published mistake is
caught."""

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.catalogue.user_attention.published.catalogue import PUBLISHED
from bench.catalogue.user_attention.published_buggy.catalogue import BUGGY
from conftest import ROOT
from model.own_attention import OwnAttention, load_attention_class
from model.own_attention.weights_seen import FUSED, WeightsSeen
from monitor.layer_contract import layer_contract, table

FOLDER = ROOT / "bench" / "catalogue" / "user_attention"


def spec(entry) -> str:
    return f"{FOLDER / entry['file']}:{entry['class_name']}"


def published(file: str, class_name: str) -> dict:
    return next(e for e in PUBLISHED if e["file"] == f"published/{file}" and e["class_name"] == class_name)


def missing(entry) -> list[str]:
    return [name for name in entry["needs"] if importlib.util.find_spec(name) is None]


def verdicts(rows) -> dict:
    return {row.check: row.verdict for row in rows}


IDENTITY = [  # (file, class, what its identity line must say)
    ("nanogpt.py", "CausalSelfAttention", ("mask causal;", "positions none", "weights a fused call recomputed")),
    ("llama2_rope.py", "MultiHeadAttention", ("mask causal;", "positions relative", "weights a softmax seen")),
    ("annotated_transformer.py", "MultiHeadedAttention", ("mask padding (mask=, bool True = keep",
                                                          "weights an attribute")),
    ("attention_is_all_you_need.py", "MultiHeadAttention", ("normalisation inside after the output projection",
                                                            "weights returned")),
    ("mha_implementations.py", "MHAPyTorchClass", ("mask causal;", "weights a fused call recomputed")),
    ("llms_from_scratch_ch03.py", "SelfAttention_v1", ("mask none;", "positions none")),
    ("vit.py", "Attention", ("normalisation inside before the projections (pre-norm)",)),
]


@pytest.mark.parametrize("file,class_name,said", IDENTITY, ids=[f"{f}:{c}" for f, c, _ in IDENTITY])
def test_a_published_class_is_taken_unchanged_and_named_by_its_family(file, class_name, said):
    entry = published(file, class_name)
    if missing(entry):
        pytest.skip(f"{file} imports {', '.join(missing(entry))}, not installed")
    rows = layer_contract(spec(entry), d_model=32, n_heads=4)
    assert not [row.check for row in rows if row.verdict == "FAIL"], table(rows)
    assert all(words in rows.identity for words in said), rows.identity


@pytest.mark.slow
@pytest.mark.parametrize("entry", PUBLISHED, ids=[f"{e['file']}:{e['class_name']}" for e in PUBLISHED])
def test_every_published_class_is_judged_as_published(entry):
    if missing(entry):
        pytest.skip(f"{entry['file']} imports {', '.join(missing(entry))}, not installed")
    rows = layer_contract(spec(entry), d_model=64, n_heads=4)
    failed = {row.check for row in rows if row.verdict == "FAIL"}
    assert not failed if entry["correct"] else failed & set(entry["expected"]), table(rows)


def test_the_books_sdpa_class_without_flash_is_caught_seeing_only_later_tokens():
    rows = layer_contract(spec(published("mha_implementations.py", "MHAPyTorchSDPAWithoutFlash")), d_model=32,
                          n_heads=4)
    row = next(row for row in rows if row.check == "look-ahead")
    assert row.verdict == "FAIL" and "own token weight 0" in row.evidence, table(rows)


def test_d_out_means_the_output_width_where_the_head_size_fails():
    # The book's wrapper takes d_out per head and concatenates: d_out = D builds and runs (width H·D, projected back)
    layer = OwnAttention(spec(published("llms_from_scratch_ch03.py", "MultiHeadAttention")), d_model=32, n_heads=4)
    assert layer.user.d_out == 32 and layer.w_o is None and layer.look_ahead


def test_a_config_object_is_made_from_json_and_the_network_sizes():
    layer = OwnAttention(spec(published("nanogpt.py", "CausalSelfAttention")), d_model=32, n_heads=4,
                         attention_args={"config": {"bias": False}})
    assert layer.user.n_embd == 32 and layer.user.n_head == 4 and layer.user.c_attn.bias is None


# ---- fused kernels ------------------------------------------------------------------------------------------------


class Fused(nn.Module):
    """Multi-head attention through F.scaled_dot_product_attention, as the fastest published variants write it."""

    def __init__(self, dim, heads, causal=False):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        B, L, D = x.shape
        q, k, v = (t.view(B, L, self.heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.out(y.transpose(1, 2).reshape(B, L, D))


def test_a_fused_call_is_answered_by_the_formula_only_while_weights_are_needed(monkeypatch):
    layer = OwnAttention(Fused, d_model=16, n_heads=2, attention_args={"causal": True}).eval()
    assert layer.weights_from == FUSED and layer.look_ahead
    x = torch.randn(2, 5, 16)
    calls = []
    kernel = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    with torch.no_grad():
        fast, _ = layer(x)
        assert len(calls) == 1  # the class's own kernel ran
        out, handed = layer(x, need_weights=True)
    q, k, v = (t.view(2, 5, 2, 8).transpose(1, 2) for t in layer.user.qkv(x).chunk(3, dim=-1))
    scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).masked_fill(torch.ones(5, 5).triu(1).bool(), -math.inf)
    assert torch.allclose(handed.weights, scores.softmax(-1), atol=1e-6)
    assert torch.allclose(out, fast, atol=1e-5)


def test_nn_multihead_attention_hands_its_per_head_weights_while_seen():
    mha = nn.MultiheadAttention(16, 2, batch_first=True).eval()
    x = torch.randn(2, 5, 16)
    with torch.no_grad(), WeightsSeen(2, 5) as seen:
        out, none = mha(x, x, x, need_weights=False)
    expected, per_head = mha(x, x, x, need_weights=True, average_attn_weights=False)
    assert none is None and seen.source == FUSED
    assert torch.allclose(seen.weights, per_head, atol=1e-6) and torch.allclose(out, expected, atol=1e-6)


@pytest.mark.slow
def test_heatmaps_appear_for_a_class_that_calls_scaled_dot_product_attention(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from conftest import SHORT, fit

    fit(tmp_path, "--model.network.attention", spec(published("nanogpt.py", "CausalSelfAttention")), *SHORT,
        "--trainer.max_epochs", "1")
    run = tmp_path / "lightning_logs" / "version_0"
    events = EventAccumulator(str(run), size_guidance={"images": 0})
    events.Reload()
    assert "attention/probe_0" in events.Tags()["images"]
    # Its look-ahead mask is its family, not a mask nobody asked for: the monitor reads the layer, not the config.
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    (history,) = [state["history"] for name, state in checkpoint["callbacks"].items() if "AttentionMonitor" in name]
    verdicts = {finding["verdict"] for entry in history for finding in entry["findings"]}
    assert history and "unasked-look-ahead" not in verdicts, verdicts


# ---- position terms -----------------------------------------------------------------------------------------------


class ALiBi(nn.Module):
    """Attention with ALiBi's distance penalty (a content-free bias on the scores), no mask."""

    def __init__(self, dim, heads, slope_scale=1.0, content=False):
        super().__init__()
        self.heads, self.content = heads, content
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.register_buffer("slopes", slope_scale * 2.0 ** -torch.arange(1, heads + 1).float())

    def forward(self, x):
        B, L, D = x.shape
        q, k, v = (p(x).view(B, L, self.heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        distance = (torch.arange(L)[None] - torch.arange(L)[:, None]).abs().float()  # (L, L)
        bias = -self.slopes[:, None, None] * distance  # (H, L, L)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        if self.content:  # a mistake: the scores stretched by the key's place, a term that depends on the content
            scores = scores * (1 + 0.5 * torch.arange(L))
        weights = (scores + bias).softmax(dim=-1)
        return self.out_proj((weights @ v).transpose(1, 2).reshape(B, L, D)), weights


def test_a_content_free_position_bias_is_its_family_not_a_mistake():
    rows = layer_contract(ALiBi, d_model=32, n_heads=4)
    assert "positions an additive bias" in rows.identity
    assert verdicts(rows)["permutation"] == "NOTE" and verdicts(rows)["formula"] == "PASS", table(rows)


def test_a_position_term_that_depends_on_the_content_still_fails():
    rows = layer_contract(ALiBi, d_model=32, n_heads=4, args={"content": True})
    assert {"permutation", "formula"} & {row.check for row in rows if row.verdict == "FAIL"}, table(rows)


def test_weights_handed_out_that_are_not_the_weights_used_are_named():
    rows = layer_contract(f"{FOLDER / 'sdpa_weights_unmasked.py'}:Attention", d_model=32, n_heads=4)
    row = next(row for row in rows if row.check == "padding")
    assert row.verdict == "FAIL" and "not the weights used" in row.evidence, table(rows)


class WideValues(nn.Module):
    """One head, numpy-style: W_Q, W_K d_model × d_k, W_V d_model × d_model (values wider than the queries)."""

    def __init__(self, d_model, d_k):
        super().__init__()
        self.W_Q = nn.Parameter(torch.randn(d_model, d_k) / math.sqrt(d_model))
        self.W_K = nn.Parameter(torch.randn(d_model, d_k) / math.sqrt(d_model))
        self.W_V = nn.Parameter(torch.randn(d_model, d_model) / math.sqrt(d_model))

    def forward(self, X):
        Q, K, V = X @ self.W_Q, X @ self.W_K, X @ self.W_V
        A = torch.softmax(Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1]), dim=-1)
        return A @ V, A


def test_values_wider_than_the_queries_are_the_formula():
    rows = layer_contract(WideValues, d_model=32, n_heads=4)
    assert verdicts(rows)["formula"] == "PASS", table(rows)


class Banded(nn.Module):
    """One head whose scores get -inf where `blocked(offset)` holds, offset = key position − query position."""

    def __init__(self, d_model, blocked):
        super().__init__()
        self.w_q, self.w_k, self.w_v = (nn.Linear(d_model, d_model, bias=False) for _ in range(3))
        self.blocked = blocked

    def forward(self, x):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        L = x.shape[1]
        offset = torch.arange(L)[None, :] - torch.arange(L)[:, None]
        weights = scores.masked_fill(self.blocked(offset), float("-inf")).softmax(-1)
        return weights @ v, weights


@pytest.mark.parametrize("blocked,said", [
    (lambda d: d > 1, "a look-ahead mask off by 1"),  # tril(diagonal=1): each token sees the next one
    (lambda d: d > 2, "a look-ahead mask off by 2"),
    (lambda d: d < 0, "the look-ahead triangle reversed"),  # tril where triu was meant
    (lambda d: d <= 0, "NaN or inf (a row with no key left"),  # the first query sees nothing
])
def test_a_triangle_that_is_not_the_look_ahead_mask_is_named(blocked, said):
    layer = Banded(16, blocked)
    rows = {row.check: row for row in layer_contract(layer, d_model=16, n_heads=1)}
    assert rows["look-ahead"].verdict == "FAIL" and said in rows["look-ahead"].evidence, rows["look-ahead"]


def test_a_window_that_blocks_far_keys_on_both_sides_is_no_look_ahead_mistake():
    rows = {row.check: row for row in layer_contract(Banded(16, lambda d: d.abs() > 1), d_model=16, n_heads=1)}
    assert rows["look-ahead"].verdict == "PASS", rows["look-ahead"]


class MaskKeptNotApplied(nn.Module):
    """The book's causal class with its masked_fill result dropped (one of the mistakes people make)."""

    def __init__(self, d_in, d_out, context_length=64):
        super().__init__()
        self.W_query, self.W_key, self.W_value = (nn.Linear(d_in, d_out, bias=False) for _ in range(3))
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        queries, keys, values = self.W_query(x), self.W_key(x), self.W_value(x)
        attn_scores = queries @ keys.transpose(1, 2)
        attn_scores.masked_fill(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)  # result not kept
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        return attn_weights @ values


def test_a_look_ahead_mask_kept_but_not_applied_is_named():
    rows = {row.check: row for row in layer_contract(MaskKeptNotApplied, d_model=16, n_heads=1)}
    assert rows["look-ahead"].verdict == "FAIL" and "not applied" in rows["look-ahead"].evidence, rows["look-ahead"]


def test_a_causal_switch_turned_off_keeps_its_buffer_without_blame():
    class Switched(MaskKeptNotApplied):
        def __init__(self, d_in, d_out):
            super().__init__(d_in, d_out)
            self.causal = False

    rows = {row.check: row for row in layer_contract(Switched, d_model=16, n_heads=1)}
    assert rows["look-ahead"].verdict == "PASS", rows["look-ahead"]


# The buggy variants (one edit each of a published class, written by someone who had not read the checks) that
# do not FAIL with a check naming their mistake, each with why: bench/own_attention.py --published counts them.
MISSED: dict[str, str] = {}


@pytest.mark.slow
@pytest.mark.parametrize("entry", BUGGY, ids=[e["file"].split("/")[-1] for e in BUGGY])
def test_a_one_edit_mistake_in_a_published_class_fails_the_check_that_names_it(entry):
    from bench.catalogue.proof import RIGHT

    if missing(entry):
        pytest.skip(f"{entry['file']} imports {', '.join(missing(entry))}, not installed")
    failed = [row.check for row in layer_contract(spec(entry), d_model=32, n_heads=4) if row.verdict == "FAIL"]
    right = [check for check in failed if RIGHT[check] & set(entry["expected"])]
    assert bool(right) != (entry["file"].split("/")[-1] in MISSED), (entry["mistake"], failed)


# ---- mistakes the product's own build hides ---------------------------------------------------------------------


class SdpaDropout(nn.Module):
    """nanoGPT's fused path: attention dropout through the kernel's dropout_p, off in evaluation (or not: `always`)."""

    def __init__(self, d_model, n_heads, dropout=0.0, always=False):
        super().__init__()
        self.n_heads, self.dropout, self.always = n_heads, dropout, always
        self.qkv, self.out = nn.Linear(d_model, 3 * d_model), nn.Linear(d_model, d_model)

    def forward(self, x):
        B, L, D = x.shape
        q, k, v = (t.view(B, L, self.n_heads, -1).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        p = self.dropout if self.training or self.always else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.out(y.transpose(1, 2).reshape(B, L, D))


@pytest.mark.parametrize("always", [False, True])
def test_dropout_that_runs_in_evaluation_fails_once_the_class_is_built_with_a_rate(always):
    # The product builds the class with dropout 0, under which such dropout drops nothing: eval-steady builds it again
    # with a rate and its weights, and runs evaluation twice.
    rows = {row.check: row for row in layer_contract(SdpaDropout, d_model=32, n_heads=4, args={"always": always})}
    assert rows["eval-steady"].verdict == ("FAIL" if always else "PASS"), rows["eval-steady"]
    assert "built with dropout=0.5" in rows["eval-steady"].evidence
    assert rows["train-eval"].verdict == "PASS", rows["train-eval"]


class Head(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.w_q, self.w_k, self.w_v = (nn.Linear(d_model, d_model, bias=False) for _ in range(3))

    def forward(self, x):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1) @ v


class Heads(nn.Module):
    """The book's wrapper of single heads, the heads' outputs concatenated along `dim`."""

    def __init__(self, d_model, num_heads, dim=-1):
        super().__init__()
        self.heads, self.dim = nn.ModuleList(Head(d_model) for _ in range(num_heads)), dim

    def forward(self, x):
        return torch.cat([head(x) for head in self.heads], dim=self.dim)


@pytest.mark.parametrize("dim", [-1, 1])
def test_heads_concatenated_along_the_tokens_fail_though_one_head_would_run(dim):
    rows = {row.check: row for row in layer_contract(Heads, d_model=16, n_heads=4, args={"dim": dim})}
    assert rows["shapes"].verdict == ("FAIL" if dim == 1 else "PASS"), rows["shapes"]
    if dim == 1:
        assert "4 × L rows" in rows["shapes"].evidence and "num_heads=1" in rows["shapes"].evidence


class QueryKeyValueMask(nn.Module):
    """forward(query, key, value, mask), the Annotated Transformer's signature; `padding` reads mask as True =
    padding where the family reads 1 = keep."""

    def __init__(self, d_model, padding=False):
        super().__init__()
        self.w_q, self.w_k, self.w_v = (nn.Linear(d_model, d_model, bias=False) for _ in range(3))
        self.padding = padding

    def forward(self, query, key, value, mask=None):
        scores = self.w_q(query) @ self.w_k(key).transpose(-2, -1) / math.sqrt(query.shape[-1])
        if mask is not None:
            keep = (mask == 0) if self.padding else mask
            scores = scores.masked_fill(keep.unsqueeze(1) == 0, -1e9)
        return scores.softmax(-1) @ self.w_v(value)


@pytest.mark.parametrize("padding", [False, True])
def test_a_plain_mask_read_against_its_signatures_family_fails_mask_name(padding):
    rows = {row.check: row for row in layer_contract(QueryKeyValueMask, d_model=16, n_heads=1,
                                                     args={"padding": padding})}
    assert rows["padding"].verdict == "PASS", rows["padding"]  # the product finds the convention either way
    assert rows["mask-name"].verdict == ("FAIL" if padding else "PASS"), rows["mask-name"]


class PostNorm(nn.Module):
    """attention-is-all-you-need-pytorch's sublayer: LayerNorm(x + W_O(attention)), or without the residual."""

    def __init__(self, d_model, n_heads, residual=True):
        super().__init__()
        self.n_heads, self.residual = n_heads, residual
        self.w_q, self.w_k, self.w_v, self.fc = (nn.Linear(d_model, d_model) for _ in range(4))
        self.layer_norm = nn.LayerNorm(d_model)

    def forward(self, x):
        B, L, D = x.shape
        q, k, v = (p(x).view(B, L, self.n_heads, -1).transpose(1, 2) for p in (self.w_q, self.w_k, self.w_v))
        weights = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).softmax(-1)
        out = self.fc((weights @ v).transpose(1, 2).reshape(B, L, D))
        return self.layer_norm(x + out if self.residual else out), weights


@pytest.mark.parametrize("residual", [True, False])
def test_a_post_norm_class_is_checked_with_its_familys_residual(residual):
    rows = layer_contract(PostNorm, d_model=32, n_heads=4, args={"residual": residual})
    assert "after the output projection (post-norm)" in rows.identity
    row = next(row for row in rows if row.check == "formula")
    assert row.verdict == ("PASS" if residual else "FAIL"), row
    assert ("layer_norm(x + W_O out)" in row.evidence) and (residual or "residual left out" in row.evidence)


class Scaled(Head):
    """One head whose scores are divided by √(factor · d_k): exactly 1/√factor × the formula's."""

    def __init__(self, d_model, factor=1.0):
        super().__init__(d_model)
        self.factor = factor

    def forward(self, x):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        weights = (q @ k.transpose(-2, -1) / math.sqrt(self.factor * q.shape[-1])).softmax(-1)
        return weights @ v, weights


@pytest.mark.parametrize("factor,verdict", [(1.0, "PASS"), (4.0, "FAIL"), (1 / 4, "FAIL"), (1.1, "PASS")])
def test_scores_an_exact_multiple_of_the_formulas_fail_scale_well_inside_four_times(factor, verdict):
    # √d_model for √d_k with 4 heads: 0.5 ×, inside the 4× the spread alone is judged by
    row = next(row for row in layer_contract(Scaled, d_model=32, n_heads=1, args={"factor": factor})
               if row.check == "scale")
    assert row.verdict == verdict, row


@pytest.mark.parametrize("causal", [False, True])
def test_a_fused_call_with_a_float_mask_is_answered_as_torch_answers_it(causal):
    """A float attn_mask (a position bias with -inf where a key may not be seen) goes through attention()'s bias."""
    from model.own_attention.weights_seen import sdpa_by_formula

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 4, generator=g) for _ in range(3))
    bias = torch.randn(5, 5, generator=g)
    bias[:, 3] = -math.inf  # key 3 never seen
    out, weights = sdpa_by_formula(q, k, v, attn_mask=bias, is_causal=False)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    if causal:
        bias = bias.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), -math.inf)
        out, weights = sdpa_by_formula(q, k, v, attn_mask=bias)
        expected = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 5)) and bool((weights[..., 3] == 0).all())
