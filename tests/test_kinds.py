"""The registry of attention kinds (model/kinds.py): a new kind plugs in with one registry line. A tiny kind
defined here, "every query sees only itself and the first token", is registered the way a new module would be and
goes through the tests that are parametrized over the registry: the formula reaching training, prediction and the
monitor, gradients, padding, the monitor's health figures and ONNX export."""

import pytest
import torch

import test_export
import test_formula
import test_long_attention
from model.attention import MultiHeadSelfAttention
from model.classifier import AttentionClassifier
from model.config import ConfigError, NetworkConfig
from model.kinds import ATTENTION_KINDS
from monitor.health import AttentionHealth

NAME = "self_and_first"


class SelfAndFirstAttention(MultiHeadSelfAttention):
    """Every query sees only itself and the first token: full attention with a different mask."""

    def mask(self, key_padding_mask, L, device=None):
        seen = torch.eye(L, dtype=torch.bool, device=device)
        seen[:, 0] = True
        blocked = ~seen[None, None]  # (1, 1, L, L)
        if key_padding_mask is not None:
            blocked = blocked | key_padding_mask.bool()[:, None, None, :]  # (B, 1, L, L)
        return blocked


@pytest.fixture
def registered(monkeypatch):
    monkeypatch.setitem(ATTENTION_KINDS, NAME, SelfAndFirstAttention)  # the one line a new kind adds


def test_every_kind_declares_a_known_key_layout():
    assert {kind.key_layout for kind in ATTENTION_KINDS.values()} <= {"tokens", "band", "virtual"}
    assert all(issubclass(kind, MultiHeadSelfAttention) for kind in ATTENTION_KINDS.values())


def test_an_unregistered_kind_is_refused_and_a_registered_one_is_taken(registered, monkeypatch):
    assert NetworkConfig(attention=NAME).attention == NAME
    monkeypatch.delitem(ATTENTION_KINDS, NAME)
    with pytest.raises(ConfigError, match=f"attention must be one of full, .*got '{NAME}'"):
        NetworkConfig(attention=NAME)


def test_the_new_kind_sees_only_itself_and_the_first_token(registered):
    config = NetworkConfig(vocab_size=30, d_model=16, n_heads=2, max_length=8, attention=NAME)
    model = AttentionClassifier(config).eval()
    assert isinstance(model.blocks[0].attention, SelfAndFirstAttention)
    mask = test_long_attention.padding_mask([8, 5, 1], L=8)
    (attention,) = model(torch.randint(1, 30, (3, 8)), mask, need_weights=True).attention
    seen = torch.eye(8, dtype=torch.bool)
    seen[:, 0] = True
    assert (attention.weights[:, :, ~seen] == 0).all()
    real = attention.weights[:2, :, 1:5]  # queries 1..4 of the two texts of 5 tokens or more: two keys each
    assert (real[..., 0] > 0).all() and (real[..., 1:5].diagonal(0, -2, -1) > 0).all()


def test_the_formula_reaches_training_prediction_and_the_monitor(registered, monkeypatch):
    test_formula.test_an_edit_of_the_formula_reaches_training_prediction_and_monitor_alike(NAME, monkeypatch)
    for causal in (False, True):
        test_formula.test_no_kind_calls_the_fused_kernel_by_default(NAME, causal, monkeypatch)


def test_gradients_and_padding(registered):
    test_long_attention.test_gradcheck(NAME)
    test_long_attention.test_classifier_padded_batch_equals_each_text_alone(NAME)
    for causal in (False, True):
        test_long_attention.test_adding_padding_changes_no_real_tokens_output(NAME, causal)


def test_the_health_figures_count_the_keys_each_query_sees(registered):
    """W_Q = 0: each row is uniform over the keys it may see (itself and the first token), so the normalized
    entropy is exactly 1; the first token sees one key only and is not counted."""
    lengths = test_long_attention.LENGTHS
    config = NetworkConfig(vocab_size=30, d_model=16, n_heads=2, max_length=11, attention=NAME)
    model = AttentionClassifier(config).eval()
    torch.nn.init.zeros_(model.blocks[0].attention.w_q.weight)
    mask = test_long_attention.padding_mask(lengths)
    attention = model(torch.randint(1, 30, mask.shape), mask, need_weights=True).attention
    health = AttentionHealth()
    health.update(attention, mask, key_layout=ATTENTION_KINDS[NAME].key_layout)
    figures = health.compute()
    torch.testing.assert_close(figures.entropy, torch.ones_like(figures.entropy))
    assert figures.rows == sum(n - 1 for n in lengths)


@pytest.mark.slow  # torch.export and ONNX conversion
def test_onnx_export_gives_pytorchs_probabilities_and_weights(registered, tmp_path):
    classifier = test_export.tiny_classifier(NAME)
    ckpt = test_export.save_checkpoint(classifier, tmp_path / "tiny.ckpt")
    assert test_export.export.main(["--ckpt", str(ckpt), "--out", str(tmp_path / "out"), "--attention"]) == 0
    test_export.test_onnxruntime_gives_pytorchs_probabilities_and_weights((NAME, classifier, tmp_path / "out"))
