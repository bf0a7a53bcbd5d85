import pytest
import torch

from conftest import SMALL, refuses
from model.classifier import AttentionClassifier
from model.config import MAX_LENGTH, POOLINGS, ConfigError, NetworkConfig


def classifier(**settings) -> AttentionClassifier:
    return AttentionClassifier(NetworkConfig(**settings))


def tiny_batch():
    token_ids = torch.tensor([[5, 6, 7, 8, 9], [3, 4, 0, 0, 0], [7, 0, 0, 0, 0]])
    return token_ids, torch.arange(5) >= torch.tensor([5, 2, 1])[:, None]  # padding from the lengths


@pytest.mark.parametrize("pooling", POOLINGS)
def test_forward_shapes_for_every_pooling(pooling):
    model = classifier(vocab_size=20, num_classes=3, d_model=16, n_heads=2, n_layers=2, d_ff=32, pooling=pooling)
    token_ids, mask = tiny_batch()
    logits, attention = model(token_ids, mask, need_weights=True)
    assert logits.shape == (3, 3)
    assert len(attention) == 2 and all(a.weights.shape == a.scores.shape == (3, 2, 5, 5) for a in attention)
    assert model(token_ids, mask).attention is None


def test_rejects_too_long_input_and_unknown_pooling():
    model = classifier(vocab_size=20, num_classes=2, d_model=8, n_heads=2, max_length=4)
    with pytest.raises(ValueError, match="max_length"):
        model(torch.ones(1, 5, dtype=torch.long))
    with pytest.raises(ConfigError, match="pooling"):
        classifier(vocab_size=20, num_classes=2, pooling="cls")


@pytest.mark.parametrize("pooling", POOLINGS)
def test_a_few_steps_drive_the_loss_down(pooling):
    torch.manual_seed(0)
    model = classifier(vocab_size=20, num_classes=3, d_model=16, n_heads=2, pooling=pooling, dropout=0.0)
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
def test_padded_batch_equals_each_text_alone(registered_kind, pooling, causal):
    """Padding is left out of every per-token step, for every kind, pooling and kernel it takes: each text in a
    padded batch gets the logits and gradients it gets alone, with or without weights handed out."""
    if refuses(registered_kind, causal=causal, pooling=pooling):
        pytest.skip(f"{registered_kind} refuses causal: {causal} with pooling: {pooling}")
    kernels = [k for k in ("manual", "fused") if not refuses(registered_kind, attention_kernel=k)]
    for kernel in kernels:
        torch.manual_seed(0)
        model = classifier(
            vocab_size=20, num_classes=3, d_model=16, n_heads=2, n_layers=2, d_ff=32, pooling=pooling, causal=causal,
            bias=True, dropout=0.0, embedding_dropout=0.0, attention=registered_kind, attention_kernel=kernel,
            **SMALL,
        )
        token_ids, mask = tiny_batch()
        batch = model(token_ids, mask).logits
        # The manual kernel runs the very same code with weights handed out; the fused one switches to it for them.
        exact = 0 if kernel == "manual" else 1e-5
        torch.testing.assert_close(model(token_ids, mask, need_weights=True).logits, batch, atol=exact, rtol=exact)
        for row in range(len(token_ids)):
            alone = token_ids[row : row + 1, : int((~mask[row]).sum())]  # (1, n): no padding at all
            torch.testing.assert_close(model(alone).logits[0], batch[row], atol=1e-5, rtol=1e-5)
        parameters = list(model.parameters())
        (grad_batch,) = torch.autograd.grad(batch[1].sum(), parameters[:1])
        (grad_alone,) = torch.autograd.grad(model(token_ids[1:2, :2]).logits.sum(), parameters[:1])
        torch.testing.assert_close(grad_batch, grad_alone, atol=1e-5, rtol=1e-4)
    assert kernels[0] == "manual"


def test_packed_path_gives_finite_logits_for_an_all_padding_sequence():
    model = classifier(vocab_size=20, num_classes=2, d_model=16, n_heads=2, d_ff=32)
    token_ids = torch.tensor([[3, 4, 5], [0, 0, 0]])
    logits = model(token_ids, torch.tensor([[False] * 3, [True] * 3])).logits  # the second text: padding only
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "none"])
def test_position_kinds(positions):
    model = classifier(vocab_size=20, num_classes=2, d_model=16, n_heads=2, positions=positions).eval()
    token_ids = torch.tensor([[3, 4, 5, 6]])
    reversed_ids = token_ids.flip(1)
    same = torch.allclose(model(token_ids).logits, model(reversed_ids).logits, atol=1e-6)
    assert same == (positions == "none")  # only without positions is word order invisible
    trainable = model.position_embedding.weight.requires_grad
    assert trainable == (positions == "learned")


@pytest.mark.parametrize("positions", ["learned", "sinusoidal"])
def test_embedding_std_scales_the_starting_vectors_and_nothing_else(positions):
    torch.manual_seed(0)
    plain = classifier(vocab_size=500, d_model=64, n_heads=2, positions=positions)
    torch.manual_seed(0)
    small = classifier(vocab_size=500, d_model=64, n_heads=2, positions=positions, embedding_std=0.1)
    assert plain.token_embedding.weight.std().item() == pytest.approx(1.0, abs=0.02)
    torch.testing.assert_close(small.token_embedding.weight, 0.1 * plain.token_embedding.weight)
    # learned positions start small too; fixed sinusoids are a table, not a random start, and stay as they are
    factor = 0.1 if positions == "learned" else 1.0
    torch.testing.assert_close(small.position_embedding.weight, factor * plain.position_embedding.weight)
    # the random stream is the same: every other weight is identical
    others = [(n, p) for n, p in plain.named_parameters() if "embedding" not in n]
    assert others and all(torch.equal(p, small.get_parameter(n)) for n, p in others)


@pytest.mark.parametrize("embedding_norm", [False, True])
def test_embedding_norm_makes_attention_blind_to_the_embeddings_scale(embedding_norm):
    model = classifier(vocab_size=20, d_model=16, n_heads=2, positions="none", embedding_norm=embedding_norm).eval()
    token_ids = torch.tensor([[3, 4, 5, 6]])
    before = model(token_ids).logits
    with torch.no_grad():
        model.token_embedding.weight.mul_(5.0)
    same = torch.allclose(before, model(token_ids).logits, atol=1e-5)
    assert same == embedding_norm  # LayerNorm(5·x) = LayerNorm(x); without it the scores grow 25-fold


@pytest.mark.parametrize(
    "settings, setting",
    [
        ({"pooling": "foo"}, "pooling"),
        ({"n_heads": 0}, "n_heads"),
        ({"d_model": 4, "n_heads": 8}, "n_heads 8 is larger than d_model 4"),
        ({"dropout": 1.5}, "dropout"),
        ({"causal": True, "pooling": "first"}, "causal"),
        ({"attention_kernel": "flash"}, "attention_kernel"),
        ({"scale": 0.0}, "scale"),
        ({"embedding_std": 0.0}, "embedding_std"),
        ({"embedding_std": -1.0}, "embedding_std"),
        ({"attention": "local", "window": 0}, "window must be a whole number >= 1"),
        ({"attention": "sparse", "window": -3}, "window"),
        ({"attention": "linformer", "projection_length": 0}, "projection_length must be a whole number >= 1"),
        ({"attention": "linformer", "projection_length": 256, "max_length": 128}, "projection_length 256 is larger than max_length 128"),
        ({"attention": "linformer", "causal": True}, "causal: true with attention: linformer"),
        ({"attention": "sparse", "global_tokens": 200, "max_length": 128}, "global_tokens 200 is larger than max_length 128"),
        ({"attention": "local", "attention_kernel": "fused"}, "attention_kernel fused applies to attention: full only"),
        ({"attention": "banded"}, "attention must be one of full, local, linformer, sparse"),
        ({"attention": "local", "window": 100000, "max_length": 128}, "window 100000 is larger than max_length 128"),
        ({"attention": "sparse", "window": 200, "max_length": 128}, "window 200 is larger than max_length 128"),
        ({"max_length": MAX_LENGTH + 1}, f"max_length {MAX_LENGTH + 1} is larger than {MAX_LENGTH}"),
        ({"d_model": 100000, "n_heads": 2}, "the network would have"),
        ({"vocab_size": 10**9}, "the network would have"),
        ({"d_ff": 10**8}, "the network would have"),
    ],
)
def test_impossible_settings_are_refused_with_one_line_naming_them(settings, setting):
    with pytest.raises(ConfigError, match=setting) as error:
        NetworkConfig(**settings)
    assert "\n" not in str(error.value)


def test_config_round_trips_through_a_plain_dict_and_refuses_unknown_keys():
    config = NetworkConfig(d_model=32, scale=0.5, causal=True, pooling="max", positions="none")
    assert NetworkConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ConfigError, match="d_modle"):
        NetworkConfig.from_dict({**config.to_dict(), "d_modle": 64})


def test_a_window_as_long_as_the_text_is_still_allowed():
    assert NetworkConfig(attention="local", window=128, max_length=128).window == 128
    with pytest.raises(ConfigError, match="window"):  # the bound that the one above sits on
        NetworkConfig(attention="local", window=129, max_length=128)
    assert NetworkConfig(attention="full", window=64, max_length=8).window == 64  # full attention reads no window


def test_bf16_autocast_runs_every_kind_close_to_float32(registered_kind):
    """`--trainer.precision bf16-mixed` (GPU or CPU): under autocast the projections come out in bfloat16 while the
    layer's input stays float32; the packed path must take the projections' dtype, forward and backward."""
    torch.manual_seed(0)
    model = classifier(vocab_size=20, num_classes=3, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0,
                       embedding_dropout=0.0, attention=registered_kind, **SMALL)
    token_ids, mask = tiny_batch()
    exact = model(token_ids, mask).logits
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(token_ids, mask, need_weights=True).logits
    logits.float().sum().backward()
    assert all(p.grad is None or torch.isfinite(p.grad).all() for p in model.parameters())
    torch.testing.assert_close(logits.float(), exact, atol=0.05, rtol=0.05)  # bfloat16 keeps ~3 significant digits


def test_no_mask_equals_an_all_false_mask_and_a_padded_batch(registered_kind):
    """A batch given without a mask (its position vectors broadcast, its rows read in place as the grid) gets the
    logits, handed-out weights and gradients of the same batch given an all-false mask, and of the same texts
    padded by one place (the scatter path)."""
    settings = dict(vocab_size=20, num_classes=3, d_model=16, n_heads=2, n_layers=2, d_ff=32, bias=True,
                    dropout=0.0, embedding_dropout=0.0, attention=registered_kind, **SMALL)
    torch.manual_seed(0)
    model = classifier(**settings)
    token_ids = torch.randint(1, 20, (3, 5))
    grid = model(token_ids, need_weights=True)
    packed = model(token_ids, torch.zeros(3, 5, dtype=torch.bool), need_weights=True)
    torch.testing.assert_close(grid.logits, packed.logits, atol=1e-5, rtol=1e-5)
    for ours, theirs in zip(grid.attention, packed.attention):
        torch.testing.assert_close(ours.weights, theirs.weights, atol=1e-5, rtol=1e-5)
    parameters = list(model.parameters())
    for got, expected in zip(torch.autograd.grad(grid.logits.square().sum(), parameters),
                             torch.autograd.grad(packed.logits.square().sum(), parameters)):
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)
    padded = torch.cat([token_ids, torch.zeros(3, 1, dtype=torch.long)], dim=1)
    scattered = model(padded, (torch.arange(6) >= 5).expand(3, 6), need_weights=True)
    torch.testing.assert_close(grid.logits, scattered.logits, atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        torch.testing.assert_close(model(token_ids).logits, grid.logits, atol=0, rtol=0)
