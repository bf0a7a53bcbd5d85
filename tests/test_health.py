"""Attention health figures on constructed weights, and on what a real layer hands out (the verdicts read from them:
tests/test_doctor.py)."""

import math

import pytest
import torch

from model.attention import AttentionWeights
from model.classifier import AttentionClassifier
from model.config import NetworkConfig
from monitor.health import AttentionHealth, normalized_entropy

B, H, L = 3, 2, 6


def padding_mask(lengths, L=L):
    return torch.arange(L)[None, :] >= torch.tensor(lengths)[:, None]  # (B, L), True = padding


def blocked_pairs(mask, causal, L=L):
    """Independent of the code under test: True where a query may not look at a key, (B, 1, L, L)."""
    blocked = mask[:, None, None, :].clone() if mask is not None else torch.zeros(1, 1, 1, L, dtype=torch.bool)
    if causal:
        blocked = blocked | torch.ones(L, L, dtype=torch.bool).triu(1)
    return blocked


def masked_softmax(scores, mask, causal=False):
    blocked = blocked_pairs(mask, causal, scores.shape[-1])
    weights = scores.masked_fill(blocked, -math.inf).softmax(-1)
    return weights.nan_to_num(0.0)  # rows with no key at all (padded queries under causal masks) become zeros


def attention_of(scores, mask=None, causal=False, weights=None):
    """What a layer would hand out for these scores: its weights, its scores, its mask."""
    weights = masked_softmax(scores, mask, causal) if weights is None else weights
    return AttentionWeights(weights, scores, blocked_pairs(mask, causal, scores.shape[-1]))


def health_of(scores, mask=None, causal=False):
    health = AttentionHealth(causal=causal)  # the config's flag: which keys a query should see
    health.update([attention_of(scores, mask, causal)], mask)
    return health.compute()


def test_uniform_rows_have_entropy_one_and_pass_all_gradient():
    mask = padding_mask([6, 4, 2])
    figures = health_of(torch.zeros(B, H, L, L), mask)
    torch.testing.assert_close(figures.entropy, torch.ones(1, H))
    torch.testing.assert_close(figures.gradient_pass, torch.ones(1, H))
    torch.testing.assert_close(figures.score_std, torch.zeros(1, H))


def test_one_key_standing_out_takes_the_weight_and_the_gradient():
    scores = torch.zeros(B, H, L, L)
    scores[..., 0] = 30.0  # every query puts all but ~1e-12 on the first key
    figures = health_of(scores)
    assert figures.max_weight.min() > 0.999
    assert figures.gradient_pass.max() < 1e-3


@pytest.mark.parametrize("causal", [False, True])
def test_normalized_entropy_ignores_padding(causal):
    torch.manual_seed(0)
    n = 4
    real_scores = torch.randn(B, H, n, n)
    padded_scores = torch.randn(B, H, L, L) * 5.0  # padded rows and keys get arbitrary values
    padded_scores[:, :, :n, :n] = real_scores
    mask = padding_mask([n] * B)
    real_weights = masked_softmax(real_scores, None, causal)
    padded_weights = masked_softmax(padded_scores, mask, causal)
    padded_weights[:, :, n:] = 1.0 / L  # a padded query's row must not count, whatever it holds

    expected = normalized_entropy(attention_of(real_scores, None, causal, real_weights))
    torch.testing.assert_close(normalized_entropy(attention_of(padded_scores, mask, causal, padded_weights), mask), expected)
    torch.testing.assert_close(health_of(padded_scores, mask, causal).entropy[0], expected)
    assert not torch.allclose(normalized_entropy(attention_of(padded_scores, None, causal, padded_weights)), expected)


def test_causal_rows_are_normalized_by_their_allowed_keys_and_single_key_rows_skipped():
    figures = health_of(torch.zeros(B, H, L, L), causal=True)  # row i is uniform over its i + 1 keys
    torch.testing.assert_close(figures.entropy, torch.ones(1, H))
    assert figures.rows == B * (L - 1)  # the first query sees one key: no choice, not counted
    torch.testing.assert_close(figures.max_weight, torch.full((1, H), sum(1 / k for k in range(2, L + 1)) / (L - 1)))


def test_sequences_of_one_token_give_no_data():
    figures = health_of(torch.randn(B, H, L, L), padding_mask([1, 1, 1]))
    assert figures.rows == 0


def test_two_batches_accumulate_exactly_like_one():
    torch.manual_seed(0)
    n_layers = 2
    scores = [torch.randn(5, H, L, L) * 3 for _ in range(n_layers)]
    mask = padding_mask([6, 2, 5, 3, 4])

    def layers(rows):
        return [attention_of(s[rows], mask[rows]) for s in scores]

    together = AttentionHealth()
    together.update(layers(slice(None)), mask)
    apart = AttentionHealth()
    apart.update(layers(slice(0, 1)), mask[:1])  # uneven split: 1 + 4 examples
    apart.update(layers(slice(1, None)), mask[1:])
    one, two = together.compute(), apart.compute()
    assert one.rows == two.rows == 6 + 2 + 5 + 3 + 4  # every real query sees two or more keys
    for name in ("entropy", "max_weight", "score_std"):
        torch.testing.assert_close(getattr(one, name), getattr(two, name))
    # An average of the two batch averages would differ: the batches hold different numbers of rows.
    first, second = AttentionHealth(), AttentionHealth()
    first.update(layers(slice(0, 1)), mask[:1])
    second.update(layers(slice(1, None)), mask[1:])
    averaged = (first.compute().entropy + second.compute().entropy) / 2
    assert not torch.allclose(averaged, one.entropy)


def test_score_std_is_the_spread_inside_rows():
    # Every allowed row holds c and c + 2 (std 1) for a different c per row; softmax ignores c, so must the figure.
    scores = torch.zeros(1, 1, 2, 2)
    scores[0, 0, 0] = torch.tensor([-50.0, -48.0])
    scores[0, 0, 1] = torch.tensor([30.0, 32.0])
    figures = health_of(scores)
    torch.testing.assert_close(figures.score_std, torch.ones(1, 1))


def test_weight_sample_is_capped_and_drawn_from_counted_pairs():
    torch.manual_seed(0)
    mask = padding_mask([6, 4, 1])
    scores = torch.randn(B, H, L, L)
    weights = masked_softmax(scores, mask)
    counted = ~blocked_pairs(mask, False) & ~mask[:, None, :, None]  # real query × real key
    counted[2] = False  # the one-token example has no choice to make
    everything = AttentionHealth(sample_size=10_000)
    everything.update([attention_of(scores, mask)], mask)
    sample = everything.compute().weight_sample[0]  # (H, N)
    for head in range(H):
        expected = weights[:, head][counted[:, 0]].sort().values
        torch.testing.assert_close(sample[head].sort().values, expected)

    capped = AttentionHealth(sample_size=7)
    capped.update([attention_of(scores, mask)], mask)
    capped.update([attention_of(scores, mask)], mask)
    assert capped.compute().weight_sample.shape == (1, H, 7)
    assert (capped.compute().weight_sample > 0).all()  # blocked pairs (exact zeros here) never enter


@pytest.mark.parametrize("causal", [False, True])
def test_health_of_a_real_layer_is_computed_from_what_it_handed_out(causal):
    """The figures come from the layer's own weights, scores and mask: a known answer built independently."""
    torch.manual_seed(0)
    model = AttentionClassifier(NetworkConfig(vocab_size=20, num_classes=3, d_model=16, n_heads=2, causal=causal))
    token_ids = torch.tensor([[5, 6, 7, 8, 9], [3, 4, 0, 0, 0], [7, 0, 0, 0, 0]])
    mask = torch.arange(5) >= torch.tensor([5, 2, 1])[:, None]  # padding from the lengths
    (attention,) = model.eval()(token_ids, mask, need_weights=True).attention
    health = AttentionHealth(causal=causal)
    health.update([attention], mask)
    figures = health.compute()
    # Independently: real queries with two or more allowed keys, entropy over those keys.
    expected_rows = (4 if causal else 5) + (1 if causal else 2)  # the one-token text and first queries don't count
    assert figures.rows == expected_rows
    entropies = []
    for b, n in enumerate([5, 2, 1]):
        for i in range(n):
            keys = i + 1 if causal else n
            if keys >= 2:
                row = attention.weights[b, :, i, :keys]  # (H, keys)
                entropies.append(-(row * row.log()).sum(-1) / math.log(keys))
    torch.testing.assert_close(figures.entropy[0], torch.stack(entropies).mean(0), atol=1e-6, rtol=1e-5)
