"""Local, Linformer and sparse attention (model/long_attention.py) against full attention, each other's claims, and
the monitor's reading of their layouts. Tiny sizes; imports no Lightning, no datasets."""

import math

import pytest
import torch

from conftest import padding_mask, refuses_causal
from model.attention import MultiHeadSelfAttention
from model.classifier import AttentionClassifier
from model.config import NetworkConfig
from model.kinds import ATTENTION_KINDS, DEFAULT_KIND
from model.attention import AttentionWeights
from model.long_attention import LocalSelfAttention
from monitor.doctor import diagnose, warnings
from monitor.health import AttentionHealth, normalized_entropy
from monitor.heatmap import attention_figure
from monitor.views import token_window

B, L, D, H = 3, 11, 16, 4
LENGTHS = [11, 7, 3]
KINDS = [name for name, kind in ATTENTION_KINDS.items() if kind.length_cap > ATTENTION_KINDS[DEFAULT_KIND].length_cap]


def full_layer(seed=0, causal=False, dtype=torch.float32):
    torch.manual_seed(seed)
    return MultiHeadSelfAttention(d_model=D, n_heads=H, causal=causal).to(dtype).eval()


def long_layer(kind, causal=False, window=2, projection_length=5, global_tokens=2, max_length=L, seed=0):
    """A long kind with the projections of full_layer(seed): the same W_Q, W_K, W_V, W_O."""
    kind_class = ATTENTION_KINDS[kind]
    config = NetworkConfig(max_length=max_length, window=window, projection_length=projection_length,
                           global_tokens=global_tokens)  # the kind's own settings, read as the classifier reads them
    torch.manual_seed(seed)
    layer = kind_class(d_model=D, n_heads=H, causal=causal, **kind_class.settings(config)).eval()
    layer.load_state_dict(full_layer(seed, causal).state_dict(), strict=False)
    return layer


def dense(attention, L=L):
    """The hand-out as a (B, H, L, L) token × token matrix."""
    return token_window(attention, 0, L)


@pytest.mark.parametrize("causal", [False, True])
def test_local_with_a_window_covering_the_text_equals_full_attention(causal):
    x, mask = torch.randn(B, L, D), padding_mask(LENGTHS, L)
    expected, expected_weights = full_layer(causal=causal)(x, mask, need_weights=True)
    for window in (L - 1, L, 3 * L):
        out, attention = long_layer("local", causal, window=window)(x, mask, need_weights=True)
        real = ~mask
        torch.testing.assert_close(out[real], expected[real], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(dense(attention).transpose(1, 2)[real], expected_weights.weights.transpose(1, 2)[real])


@pytest.mark.parametrize("causal", [False, True])
def test_sparse_with_every_token_global_equals_full_attention(causal):
    x, mask = torch.randn(B, L, D), padding_mask(LENGTHS, L)
    expected, expected_weights = full_layer(causal=causal)(x, mask, need_weights=True)
    out, attention = long_layer("sparse", causal, window=1, global_tokens=L)(x, mask, need_weights=True)
    real = ~mask
    torch.testing.assert_close(out[real], expected[real], atol=1e-6, rtol=1e-5)
    assert attention.global_rows.weights.shape == (B, H, L, L)
    torch.testing.assert_close(dense(attention).transpose(1, 2)[real], expected_weights.weights.transpose(1, 2)[real])


def test_sparse_global_tokens_see_everything_and_are_seen_by_everything():
    x, mask = torch.randn(B, L, D), padding_mask(LENGTHS, L)
    _, attention = long_layer("sparse", window=1, global_tokens=2)(x, mask, need_weights=True)
    weights = dense(attention)  # (B, H, L, L)
    for b, n in enumerate(LENGTHS):
        assert (weights[b, :, :2, :n] > 0).all()  # the global queries see every real token
        assert (weights[b, :, :n, :2] > 0).all()  # every real query sees the global keys
    far = (torch.arange(L)[:, None] - torch.arange(L)).abs() > 1  # outside the window of 1
    far[:2], far[:, :2] = False, False  # the global rows and columns
    assert (weights[:, :, far] == 0).all()


def test_linformer_with_k_equal_l_and_identity_projections_equals_full_attention():
    x = torch.randn(B, L, D)
    expected, expected_weights = full_layer()(x, need_weights=True)
    layer = long_layer("linformer", projection_length=L)
    with torch.no_grad():
        layer.key_projection.copy_(torch.eye(L))
        layer.value_projection.copy_(torch.eye(L))
    out, attention = layer(x, need_weights=True)
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(attention.weights, expected_weights.weights)  # virtual key r is token r here


def test_gradcheck(registered_kind):
    """Gradients of forward() and forward_packed() against finite differences, on the smallest input that still
    crosses every path: 3 blocks of w = 2 (the last one cut short), a global token, 4 projected keys, and a padded
    query whose whole window is padding (an empty row)."""
    kind_class = ATTENTION_KINDS[registered_kind]
    settings = kind_class.settings(NetworkConfig(max_length=5, window=2, global_tokens=1, projection_length=4))
    torch.manual_seed(0)
    layer = kind_class(d_model=4, n_heads=2, **settings).double().eval()
    x = torch.randn(2, 5, 4, dtype=torch.double, requires_grad=True)
    mask = padding_mask([5, 2], L=5)
    assert torch.autograd.gradcheck(lambda x: layer(x, mask)[0], (x,))
    real = ~mask
    assert torch.autograd.gradcheck(lambda t: layer.forward_packed(t, mask)[0], (x.detach()[real].requires_grad_(),))


@pytest.mark.parametrize("causal", [False, True])
def test_adding_padding_changes_no_real_tokens_output(registered_kind, causal):
    if causal and refuses_causal(registered_kind):
        pytest.skip(f"{registered_kind} refuses the look-ahead mask")
    layer = long_layer(registered_kind, causal, max_length=3 * L)
    x, mask = torch.randn(B, L, D), padding_mask(LENGTHS, L)
    out, _ = layer(x, mask)
    for extra in (1, 5, 2 * L):  # more padding, ending mid-block or blocks later
        more = torch.cat([x, torch.randn(B, extra, D) * 100], dim=1)  # padded places hold anything
        padded, _ = layer(more, padding_mask(LENGTHS, L + extra))
        torch.testing.assert_close(padded[:, :L][~mask], out[~mask], atol=1e-5, rtol=1e-5)
    real = ~mask
    packed, _ = layer.forward_packed(x[real], mask)
    torch.testing.assert_close(packed, out[real], atol=1e-5, rtol=1e-5)
    for b, n in enumerate(LENGTHS):  # and each text alone, with no padding at all
        alone, _ = layer(x[b : b + 1, :n])
        torch.testing.assert_close(alone[0], out[b, :n], atol=1e-5, rtol=1e-5)


WINDOWED = [name for name, kind in ATTENTION_KINDS.items() if issubclass(kind, LocalSelfAttention)]


@pytest.mark.parametrize("kind", WINDOWED)
def test_the_look_ahead_mask_never_looks_ahead(kind):
    layer = long_layer(kind, causal=True, window=3)
    x = torch.randn(1, L, D, requires_grad=True)
    out, attention = layer(x, need_weights=True)
    for i in range(L):
        (grad,) = torch.autograd.grad(out[0, i].sum(), x, retain_graph=True)
        assert (grad[0, i + 1 :] == 0).all()  # no later token changes token i
    assert (dense(attention).triu(1) == 0).all()
    positions = attention.key_positions  # (L, K)
    seen = (attention.weights > 0).any(dim=0).any(dim=0)  # (L, K)
    assert (positions[seen] <= torch.arange(L)[:, None].expand_as(positions)[seen]).all()


def test_local_never_sees_past_its_window():
    x = torch.randn(1, L, D, requires_grad=True)
    out, _ = long_layer("local", window=2)(x)
    (grad,) = torch.autograd.grad(out[0, 5].sum(), x)
    changed = grad[0].abs().sum(-1) > 0
    assert changed.tolist() == [abs(j - 5) <= 2 for j in range(L)]


@pytest.mark.parametrize("kind, shape", [
    ("local", (B, H, L, 2 * 2 + 1)), ("linformer", (B, H, L, 5)), ("sparse", (B, H, L, 2 + 2 * 2 + 1)),
])
def test_hand_out_shapes_rows_sum_to_one_and_blocked_places_are_exactly_zero(kind, shape):
    x, mask = torch.randn(B, L, D), padding_mask(LENGTHS, L)
    _, attention = long_layer(kind)(x, mask, need_weights=True)
    assert isinstance(attention, AttentionWeights)
    assert attention.weights.shape == attention.scores.shape == shape
    assert attention.key_positions.shape == shape[-2:]
    blocked = attention.blocked.expand(shape) if attention.blocked is not None else torch.zeros(shape, dtype=bool)
    assert (attention.weights[blocked] == 0).all()
    sums = attention.weights.sum(-1)  # (B, H, L)
    handed_out = ~blocked.all(-1)  # rows not handed out elsewhere (sparse's global rows)
    torch.testing.assert_close(sums[handed_out], torch.ones_like(sums[handed_out]))
    if kind == "local":  # column o of row i is key i - w + o
        assert attention.key_positions[4].tolist() == [2, 3, 4, 5, 6]
        assert blocked[2, 0, 1].tolist() == [True, False, False, False, True]  # keys -1 (outside), 0, 1, 2, 3 (padding)
    if kind == "sparse":
        assert attention.global_rows.weights.shape == (B, H, 2, L)
        assert attention.key_positions[6].tolist() == [0, 1, 4, 5, 6, 7, 8]


def test_causal_local_hands_out_the_window_before_each_token():
    _, attention = long_layer("local", causal=True, window=3)(torch.randn(B, L, D), need_weights=True)
    assert attention.weights.shape == (B, H, L, 4)
    assert attention.key_positions[5].tolist() == [2, 3, 4, 5]


@pytest.mark.parametrize("kind", list(ATTENTION_KINDS))
def test_health_entropy_is_over_the_keys_a_query_can_see(kind):
    """With W_Q = 0 every score is 0: each row is uniform over the keys it may see, so the normalized entropy is
    exactly 1 whatever the layout; a wrong count of visible keys (a band place outside the text, a padded key)
    would make it smaller."""
    config = NetworkConfig(vocab_size=30, d_model=D, n_heads=H, max_length=L, attention=kind, window=2,
                           projection_length=4, global_tokens=2)
    model = AttentionClassifier(config).eval()
    for block in model.blocks:
        torch.nn.init.zeros_(block.attention.w_q.weight)
    ids = torch.randint(1, 30, (B, L))
    mask = padding_mask(LENGTHS, L)
    attention = model(ids, mask, need_weights=True).attention
    health = AttentionHealth()
    health.update(attention, mask)
    figures = health.compute()
    torch.testing.assert_close(figures.entropy, torch.ones_like(figures.entropy))
    torch.testing.assert_close(normalized_entropy(attention[0], mask), torch.ones(H))
    real_queries = sum(n for n in LENGTHS if n >= 2)
    assert figures.rows == real_queries  # every real query of a text of 2+ tokens sees two or more keys
    assert [f.verdict for f in warnings(diagnose(figures))] == ["scale-too-small"]  # every score 0


def test_health_reads_a_fixed_sample_of_rows_and_estimates_the_whole():
    torch.manual_seed(0)
    scores = torch.randn(16, H, 40, 40) * 2
    attention = [AttentionWeights(scores.softmax(-1), scores, None, torch.arange(40).expand(40, 40))]
    exact, sampled = AttentionHealth(rows_per_batch=None), AttentionHealth(rows_per_batch=160)
    for health in (exact, sampled):
        health.update(attention)
    assert sampled.rows_read == 160 and exact.rows_read == sampled.rows == exact.rows == 16 * 40
    for name in ("entropy", "max_weight", "score_std"):
        torch.testing.assert_close(getattr(sampled.compute(), name), getattr(exact.compute(), name), rtol=0.05, atol=0)
    again = AttentionHealth(rows_per_batch=160)
    again.update(attention)
    torch.testing.assert_close(again.compute().entropy, sampled.compute().entropy)  # the same rows every time


@pytest.mark.slow
@pytest.mark.parametrize("kind, columns", [("local", 40), ("sparse", 40), ("linformer", 16)])
def test_heatmap_of_a_2000_token_text_is_a_readable_window(kind, columns):
    config = NetworkConfig(vocab_size=30, d_model=8, n_heads=2, max_length=2000, attention=kind, window=8,
                           projection_length=16, global_tokens=1)
    model = AttentionClassifier(config).eval()
    (attention,) = model(torch.randint(1, 30, (1, 2000)), need_weights=True).attention
    global_rows = attention.global_rows.weights[0] if attention.global_rows is not None else None
    figure = attention_figure(attention.weights[0], [f"t{i}" for i in range(2000)], "review", max_tokens=40,
                              key_positions=attention.key_positions, global_weights=global_rows)
    (ax, *_) = [ax for ax in figure.axes if ax.images]
    assert ax.images[0].get_array().shape == (40, columns)
    assert "first 40 of 2000 tokens" in figure.get_suptitle()
    if kind == "local":  # the band: keys more than w = 8 away hold nothing
        image = torch.as_tensor(ax.images[0].get_array().data)
        assert (image.triu(9) == 0).all() and (image.tril(-9) == 0).all() and (image.diagonal() > 0).all()


def peak_bytes(run) -> int:
    """Peak bytes of tensors alive at once during run(), from the profiler's record of PyTorch's CPU allocations."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profile:
        run()
    changes = sorted((e.start_ns(), e.nbytes()) for e in profile.profiler.kineto_results.events() if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in changes:
        live += nbytes
        peak = max(peak, live)
    return peak


def test_memory_of_local_attention_grows_linearly_with_length():
    layer = LocalSelfAttention(d_model=16, n_heads=2, window=32)
    full = MultiHeadSelfAttention(d_model=16, n_heads=2)

    def step(attention, L):
        x = torch.randn(1, L, 16, requires_grad=True)
        return lambda: attention(x)[0].sum().backward()

    local = {L: peak_bytes(step(layer, L)) for L in (1024, 2048, 4096)}
    assert 1.8 < local[2048] / local[1024] < 2.2 and 1.8 < local[4096] / local[2048] < 2.2
    quadratic = {L: peak_bytes(step(full, L)) for L in (512, 1024)}
    assert quadratic[1024] / quadratic[512] > 3.5  # the measure does see L²
    assert local[4096] < quadratic[1024]


def test_settings_of_other_kinds_do_not_get_in_the_way():
    NetworkConfig(max_length=64)  # the default projection_length 128 matters to linformer only
    assert NetworkConfig.from_dict({"max_length": 64}).attention == "full"  # checkpoints from before: full attention
    assert math.isclose(sum(p.numel() for p in long_layer("local").parameters()),
                        sum(p.numel() for p in full_layer().parameters()))  # local adds no parameter


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_predict_hands_out_each_kinds_layout_and_draws_it(kind):
    from data.tokenizer import train_tokenizer
    from inference import TextClassifier

    tokenizer = train_tokenizer(["alpha beta gamma delta epsilon"] * 5, vocab_size=40, max_length=32, kind="word")
    config = NetworkConfig(vocab_size=40, max_length=32, d_model=8, n_heads=2, n_layers=2, attention=kind, window=2,
                           projection_length=4, global_tokens=1)
    classifier = TextClassifier(AttentionClassifier(config), tokenizer, ["negative", "positive"], device="cpu")
    texts = ["alpha beta", "alpha beta gamma delta epsilon alpha beta"]
    for prediction, n in zip(classifier.predict(texts, attention=True), (2, 7)):
        # The kind's own layout: as many columns as its layer hands out for a text of n tokens
        handed_out = classifier.model(torch.ones(1, n, dtype=torch.long), need_weights=True).attention[0]
        columns = handed_out.weights.shape[-1]
        assert prediction.attention.shape == (2, 2, n, columns)  # (n_layers, H, tokens, the kind's K keys)
        assert prediction.attention_keys.shape == (n, columns)
        out = prediction.to_dict()
        assert len(out["attention"][0]) == n and len(out["attention_keys"]) == n
        assert (prediction.global_attention is None) == (handed_out.global_rows is None)
        if handed_out.global_rows is not None:  # a kind with global tokens (sparse): their rows over every token
            assert prediction.global_attention.shape == (2, 2, 1, n)
            torch.testing.assert_close(prediction.global_attention.sum(-1), torch.ones(2, 2, 1))
        figure = attention_figure(prediction.attention, prediction.tokens, key_positions=prediction.attention_keys,
                                  global_weights=prediction.global_attention)
        (ax, *_) = [ax for ax in figure.axes if ax.images]
        assert ax.images[0].get_array().shape == (n, n if ATTENTION_KINDS[kind].keys_are_tokens else columns)
