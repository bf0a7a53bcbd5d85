"""The hand-written attention layer against independent references. Imports no Lightning, no datasets."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import padding_mask
from model.attention import MultiHeadSelfAttention

B, L, D, H = 3, 7, 16, 4


def make_layer(seed=0, **kwargs):
    torch.manual_seed(seed)
    return MultiHeadSelfAttention(d_model=D, n_heads=H, **kwargs).eval()


def weights_of(layer, x, mask=None):
    """(out, weights (B, H, L, L)) from the layer's own hand-out."""
    out, attention = layer(x, key_padding_mask=mask, need_weights=True)
    return out, attention.weights


def qkv(layer, x):
    return [layer.split_heads(w(x)) for w in (layer.w_q, layer.w_k, layer.w_v)]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("use_padding", [False, True])
def test_matches_scaled_dot_product_attention(causal, use_padding):
    layer = make_layer(causal=causal)
    x = torch.randn(B, L, D)
    mask = padding_mask([7, 5, 2], L) if use_padding else None
    out, _ = layer(x, key_padding_mask=mask)

    q, k, v = qkv(layer, x)
    allowed = torch.ones(B, 1, L, L, dtype=torch.bool)
    if use_padding:
        allowed &= ~mask[:, None, None, :]
    if causal:
        allowed &= torch.ones(L, L, dtype=torch.bool).tril()
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    expected = layer.w_o(layer.merge_heads(expected))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_matches_nn_multihead_attention_with_copied_weights():
    layer = make_layer()
    reference = torch.nn.MultiheadAttention(D, H, bias=False, batch_first=True).eval()
    with torch.no_grad():
        w_q, w_k, w_v = reference.in_proj_weight.chunk(3)
        layer.w_q.weight.copy_(w_q)
        layer.w_k.weight.copy_(w_k)
        layer.w_v.weight.copy_(w_v)
        layer.w_o.weight.copy_(reference.out_proj.weight)
    x = torch.randn(B, L, D)
    mask = padding_mask([7, 4, 1], L)

    out, weights = weights_of(layer, x, mask)
    expected_out, expected_weights = reference(x, x, x, key_padding_mask=mask, need_weights=True)
    torch.testing.assert_close(out, expected_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.mean(dim=1), expected_weights, atol=1e-6, rtol=1e-5)


def numpy_attention(x, w_q, w_k, w_v, w_o, n_heads, pad):
    """The seed formula per head, in numpy: softmax(Q Kᵀ / √d) V, heads concatenated, then W_O."""
    d = w_q.shape[1] // n_heads
    heads = []
    for h in range(n_heads):
        cols = slice(h * d, (h + 1) * d)
        Q, K, V = x @ w_q[:, cols], x @ w_k[:, cols], x @ w_v[:, cols]
        S = Q @ K.T / math.sqrt(d)
        S[:, pad] = -np.inf
        A = np.exp(S - S.max(axis=1, keepdims=True))
        A /= A.sum(axis=1, keepdims=True)
        heads.append(A @ V)
    return np.concatenate(heads, axis=1) @ w_o


def test_matches_numpy_formula():
    layer = make_layer(bias=False)
    x = torch.randn(B, L, D, dtype=torch.float64)
    layer = layer.double()
    mask = padding_mask([7, 3, 5], L)
    out, _ = layer(x, key_padding_mask=mask)
    # nn.Linear stores W transposed: y = x Wᵀ, so the formula's W_Q is weight.T.
    w = {name: getattr(layer, name).weight.detach().numpy().T for name in ("w_q", "w_k", "w_v", "w_o")}
    for b in range(B):
        pad = mask[b].numpy()
        expected = numpy_attention(x[b].numpy(), w["w_q"], w["w_k"], w["w_v"], w["w_o"], H, pad)
        np.testing.assert_allclose(out[b].detach().numpy(), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kernel", ["manual", "fused"])
@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_float64_with_padding(causal, kernel):
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(d_model=6, n_heads=2, bias=True, causal=causal, kernel=kernel).double()
    x = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    mask = padding_mask([4, 2], L=4)
    assert torch.autograd.gradcheck(lambda x: layer(x, key_padding_mask=mask)[0], (x,))


def test_rows_sum_to_one_and_padded_keys_get_exactly_zero():
    layer = make_layer()
    mask = padding_mask([7, 5, 2], L)
    _, weights = weights_of(layer, torch.randn(B, L, D), mask)
    assert weights.shape == (B, H, L, L)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, L))
    assert (weights.masked_select(mask[:, None, None, :].expand_as(weights)) == 0).all()


def test_causal_upper_triangle_is_exactly_zero():
    layer = make_layer(causal=True)
    _, weights = weights_of(layer, torch.randn(B, L, D))
    upper = torch.ones(L, L, dtype=torch.bool).triu(diagonal=1)
    assert (weights[..., upper] == 0).all()
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, H, L))


def test_all_padding_row_gives_zeros_not_nan():
    layer = make_layer()
    x = torch.randn(2, L, D, requires_grad=True)
    mask = padding_mask([3, 0], L)  # the second sequence is padding only
    out, weights = weights_of(layer, x, mask)
    assert torch.isfinite(out).all()
    assert (weights[1] == 0).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    # Left padding with a look-ahead mask: the first queries see no key at all.
    left = torch.arange(L)[None, :] < 2
    out, weights = weights_of(make_layer(causal=True), torch.randn(1, L, D), left)
    assert torch.isfinite(out).all() and (weights[0, :, :2] == 0).all()


def test_single_token():
    layer = make_layer()
    out, weights = weights_of(layer, torch.randn(B, 1, D))
    assert out.shape == (B, 1, D)
    torch.testing.assert_close(weights, torch.ones(B, H, 1, 1))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [[7, 5, 2], [7, 0, 3], None])
def test_fused_kernel_equals_the_written_formula(causal, lengths):
    """The opt-in kernel is the same function: outputs and gradients, with padding, look-ahead and empty rows."""
    manual = make_layer(bias=True, causal=causal)
    fused = make_layer(bias=True, causal=causal, kernel="fused")
    fused.load_state_dict(manual.state_dict())
    x = torch.randn(B, L, D, requires_grad=True)
    mask = None if lengths is None else padding_mask(lengths, L)
    reference, _ = manual(x, key_padding_mask=mask)
    out, weights = fused(x, key_padding_mask=mask)
    assert weights is None
    torch.testing.assert_close(out, reference, atol=1e-5, rtol=1e-5)
    (grad_reference,) = torch.autograd.grad(reference.square().sum(), x)
    (grad_fused,) = torch.autograd.grad(out.square().sum(), x)
    torch.testing.assert_close(grad_fused, grad_reference, atol=1e-5, rtol=1e-4)


def test_scores_handed_out_are_the_layers_own():
    """The monitor reads these: Q Kᵀ · scale as the layer computed it, and its own mask."""
    layer = make_layer(causal=True, scale=0.3)
    x = torch.randn(B, L, D)
    mask = padding_mask([7, 5, 2], L)
    _, attention = layer(x, key_padding_mask=mask, need_weights=True)
    q, k, _ = qkv(layer, x)
    blocked = attention.blocked.expand(B, H, L, L)
    torch.testing.assert_close(attention.scores[~blocked], ((q @ k.transpose(-2, -1)) * 0.3)[~blocked])
    expected_blocked = mask[:, None, None, :] | torch.ones(L, L, dtype=torch.bool).triu(1)
    assert torch.equal(blocked, expected_blocked.expand(B, H, L, L))


def normalized_entropy(weights):
    return -(weights * weights.clamp_min(1e-12).log()).sum(-1).mean() / math.log(weights.shape[-1])


def test_smaller_scale_gives_more_uniform_attention():
    """The seed's point: the Q·K scale sets how peaked softmax is."""
    x = torch.randn(B, 32, D)
    entropies = {}
    for name, scale in [("small", 0.01), ("default", None), ("large", 4.0)]:
        torch.manual_seed(0)  # the same weights each time; only the scale differs
        layer = MultiHeadSelfAttention(d_model=D, n_heads=H, scale=scale).eval()
        entropies[name] = normalized_entropy(weights_of(layer, x)[1]).item()
    assert entropies["small"] > entropies["default"] > entropies["large"]
    assert entropies["small"] > 0.99  # nearly uniform: the model can no longer tell tokens apart


def test_default_scale_is_one_over_sqrt_head_size():
    assert MultiHeadSelfAttention(d_model=64, n_heads=4).scale == pytest.approx(1 / 4)
    assert MultiHeadSelfAttention(d_model=64, n_heads=4, d_head=64).scale == pytest.approx(1 / 8)
    assert MultiHeadSelfAttention(d_model=64, n_heads=4, scale=1.0).scale == 1.0


def test_attention_dropout_only_in_training():
    layer = MultiHeadSelfAttention(d_model=D, n_heads=H, dropout=0.5)
    x = torch.randn(B, L, D)
    layer.eval()
    torch.testing.assert_close(layer(x)[0], layer(x)[0])
    layer.train()
    assert not torch.allclose(layer(x)[0], layer(x)[0])


@pytest.mark.parametrize("kernel", ["manual", "fused"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("left_padding", [False, True])
def test_packed_path_equals_reference_path_at_real_tokens(causal, left_padding, kernel):
    layer = make_layer(bias=True, causal=causal, kernel=kernel)
    mask = padding_mask([7, 5, 2], L)
    if left_padding:
        mask = mask.flip(-1)
    x = torch.randn(B, L, D, requires_grad=True)
    reference, reference_weights = weights_of(make_layer(bias=True, causal=causal), x, mask)  # manual, (B, L, D)
    reference = reference[~mask]  # (N, D): padded places are nobody's output
    packed, _ = layer.forward_packed(x[~mask], mask)
    torch.testing.assert_close(packed, reference, atol=1e-5, rtol=1e-5)
    _, packed_attention = layer.forward_packed(x[~mask], mask, need_weights=True)
    real_queries = ~mask[:, None, :, None].expand(B, H, L, L)  # rows of padded queries are nobody's
    torch.testing.assert_close(packed_attention.weights[real_queries], reference_weights[real_queries])
    target = torch.randn_like(reference)
    grads_reference = torch.autograd.grad((reference * target).sum(), [x])
    grads_packed = torch.autograd.grad((packed * target).sum(), [x])
    for got, expected in zip(grads_packed, grads_reference):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lengths", [[7, 5, 2], [7, 0, 3], None])
def test_evaluation_without_gradient_gives_the_training_paths_numbers(causal, lengths):
    """Under no_grad / inference_mode, attention() lets the softmax overwrite the scores nobody reads afterwards:
    the same numbers, bit for bit, as with a gradient taken; asked for, the scores are still handed out whole."""
    layer = make_layer(bias=True, causal=causal)
    x = torch.randn(B, L, D, requires_grad=True)
    mask = None if lengths is None else padding_mask(lengths, L)
    trained, _ = layer(x, key_padding_mask=mask)
    with torch.no_grad():
        evaluated, _ = layer(x, key_padding_mask=mask)
        _, attention = layer(x, key_padding_mask=mask, need_weights=True)
    with torch.inference_mode():
        inferred, _ = layer(x.detach(), key_padding_mask=mask)
    assert torch.equal(evaluated, trained) and torch.equal(inferred, trained)
    q, k, _ = qkv(layer, x.detach())
    allowed = torch.ones(B, H, L, L, dtype=torch.bool) if attention.blocked is None else ~attention.blocked.expand(
        B, H, L, L)
    torch.testing.assert_close(attention.scores[allowed], (q @ k.transpose(-2, -1) * layer.scale)[allowed])
    assert not torch.equal(attention.scores, attention.weights)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_path_with_nothing_padded_reads_the_rows_as_the_grid(causal):
    """N = B·L: forward_packed reads the rows in place instead of scattering them onto a grid of zeros; the same
    as forward() and as the scatter path (the same texts with a padded place added), outputs, weights, gradients."""
    layer = make_layer(bias=True, causal=causal)
    x = torch.randn(B, L, D, requires_grad=True)
    packed, packed_attention = layer.forward_packed(x.flatten(0, 1), torch.zeros(B, L, dtype=torch.bool), True)
    reference, reference_attention = layer(x, None, need_weights=True)
    torch.testing.assert_close(packed, reference.flatten(0, 1), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(packed_attention.weights, reference_attention.weights, atol=1e-6, rtol=1e-5)
    mask = padding_mask([L] * B, L + 1)  # one padded place after every text
    scattered, scattered_attention = layer.forward_packed(x.flatten(0, 1), mask, need_weights=True)
    torch.testing.assert_close(packed, scattered, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(packed_attention.weights, scattered_attention.weights[..., :L, :L], atol=1e-6,
                               rtol=1e-5)
    target = torch.randn_like(packed)
    (grad_packed,) = torch.autograd.grad((packed * target).sum(), x)
    (grad_scattered,) = torch.autograd.grad((scattered * target).sum(), x)
    torch.testing.assert_close(grad_packed, grad_scattered, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [False, True])
def test_inference_in_slices_of_texts_gives_the_whole_batchs_numbers(monkeypatch, causal):
    """Inference of a batch whose scores pass SLICE_BYTES runs attention() on slices of texts: each text's
    numbers are its own, so they equal the whole batch's (with a gradient taken, never sliced); masks follow their
    texts (a padded text, a text of padding only), a look-ahead mask broadcasts to every slice."""
    import model.attention as attention_module

    layer = make_layer(bias=True, causal=causal).eval()
    x = torch.randn(B, L, D, requires_grad=True)
    mask = padding_mask([L, 0, 3][:B] + [L] * max(0, B - 3), L)
    whole, _ = layer(x, key_padding_mask=mask)
    monkeypatch.setattr(attention_module, "SLICE_BYTES", 1)  # one text a slice
    calls, formula = [], attention_module.attention
    monkeypatch.setattr(attention_module, "attention", lambda *a, **k: calls.append(a[0].shape[0]) or formula(*a, **k))
    with torch.no_grad():
        sliced, _ = layer(x, key_padding_mask=mask)
    assert calls == [1] * B
    torch.testing.assert_close(sliced, whole, atol=1e-6, rtol=1e-5)
