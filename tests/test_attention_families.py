"""Attention as published code writes it (monitor/layer_family.py, model/weights_seen.py, model/mask_probe.py,
model/user_class.py): classes copied unchanged from public repositories (bench/catalogue/user_attention/published/)
are taken as they are and judged against their own family, printed as an identity line; fused kernels are seen
through while weights are needed and left alone otherwise; a published mistake is caught."""

import importlib.util
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from bench.catalogue.user_attention.published.catalogue import PUBLISHED
from conftest import ROOT
from model.own_attention import OwnAttention, load_attention_class
from model.weights_seen import FUSED, WeightsSeen
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
