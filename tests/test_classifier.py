import pytest
import torch

from model.classifier import POOLINGS, AttentionClassifier


def tiny_batch():
    token_ids = torch.tensor([[5, 6, 7, 8, 9], [3, 4, 0, 0, 0], [7, 0, 0, 0, 0]])
    return token_ids, token_ids == 0


@pytest.mark.parametrize("pooling", POOLINGS)
def test_forward_shapes_for_every_pooling(pooling):
    model = AttentionClassifier(vocab_size=20, num_classes=3, d_model=16, n_heads=2, n_layers=2, d_ff=32, pooling=pooling)
    token_ids, mask = tiny_batch()
    logits, attention = model(token_ids, mask, need_weights=True)
    assert logits.shape == (3, 3)
    assert len(attention) == 2 and all(a.shape == (3, 2, 5, 5) for a in attention)
    assert model(token_ids, mask).attention is None


@pytest.mark.parametrize("pooling", ["mean", "max", "attention"])
def test_pooling_ignores_padding(pooling):
    model = AttentionClassifier(vocab_size=20, num_classes=2, d_model=16, n_heads=2, pooling=pooling).eval()
    short = torch.tensor([[3, 4]])
    padded = torch.tensor([[3, 4, 0, 0]])
    logits_short = model(short, short == 0).logits
    logits_padded = model(padded, padded == 0).logits
    torch.testing.assert_close(logits_short, logits_padded, atol=1e-5, rtol=1e-5)


def test_rejects_too_long_input_and_unknown_pooling():
    model = AttentionClassifier(vocab_size=20, num_classes=2, d_model=8, n_heads=2, max_length=4)
    with pytest.raises(ValueError, match="max_length"):
        model(torch.ones(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="pooling"):
        AttentionClassifier(vocab_size=20, num_classes=2, pooling="cls")


@pytest.mark.parametrize("pooling", POOLINGS)
def test_a_few_steps_drive_the_loss_down(pooling):
    torch.manual_seed(0)
    model = AttentionClassifier(vocab_size=20, num_classes=3, d_model=16, n_heads=2, pooling=pooling, dropout=0.0)
    token_ids, mask = tiny_batch()
    labels = torch.tensor([0, 1, 2])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(token_ids, mask).logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.1 * losses[0]


@pytest.mark.parametrize("pooling", POOLINGS)
@pytest.mark.parametrize("causal", [False, True])
def test_packed_path_equals_reference_path(pooling, causal):
    """need_weights=False leaves padding out of every per-token step; logits and gradients must not change."""
    torch.manual_seed(0)
    model = AttentionClassifier(
        vocab_size=20, num_classes=3, d_model=16, n_heads=2, n_layers=2, d_ff=32, pooling=pooling, causal=causal,
        bias=True, dropout=0.0, embedding_dropout=0.0,
    )
    token_ids, mask = tiny_batch()
    reference = model(token_ids, mask, need_weights=True).logits  # the explicit path, padding computed throughout
    packed = model(token_ids, mask, need_weights=False).logits
    torch.testing.assert_close(packed, reference, atol=1e-5, rtol=1e-5)
    parameters = list(model.parameters())
    target = torch.randn_like(reference)
    grads_reference = torch.autograd.grad((reference * target).sum(), parameters)
    grads_packed = torch.autograd.grad((packed * target).sum(), parameters)
    for got, expected in zip(grads_packed, grads_reference):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


def test_packed_path_gives_finite_logits_for_an_all_padding_sequence():
    model = AttentionClassifier(vocab_size=20, num_classes=2, d_model=16, n_heads=2, d_ff=32)
    token_ids = torch.tensor([[3, 4, 5], [0, 0, 0]])
    logits = model(token_ids, token_ids == 0).logits
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
def test_position_kinds(positions):
    model = AttentionClassifier(vocab_size=20, num_classes=2, d_model=16, n_heads=2, positions=positions).eval()
    token_ids = torch.tensor([[3, 4, 5, 6]])
    reversed_ids = token_ids.flip(1)
    same = torch.allclose(model(token_ids).logits, model(reversed_ids).logits, atol=1e-6)
    assert same == (positions == "none")  # only without positions is word order invisible
    trainable = model.position_embedding.weight.requires_grad
    assert trainable == (positions == "learned")
