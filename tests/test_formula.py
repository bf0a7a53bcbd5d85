"""The formula a reader sees is the formula that trains: edit `MultiHeadSelfAttention.attend` and every path
(training loss, predictions with and without weights, the monitor's figures) follows; the default kernel never
calls torch's fused attention."""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import train
from data.tokenizer import train_tokenizer
from inference import TextClassifier
from model.attention import MultiHeadSelfAttention
from model.config import NetworkConfig
from monitor.health import AttentionHealth
from training.module import ClassifierModule

ROOT = Path(__file__).resolve().parents[1]
TEXTS = ["alpha beta gamma delta", "beta beta alpha", "gamma delta alpha beta gamma", "delta"]
TEMPERATURE = 4.0


def sharper(original):
    """A user's edit of the formula: scores multiplied by a temperature (q·4 makes q·kᵀ four times larger)."""

    def attend(self, q, k, v, blocked, need_weights=False):
        return original(self, q * TEMPERATURE, k, v, blocked, need_weights)

    return attend


def everything_the_paths_give(module, classifier, batch):
    """Training loss, predictions without and with weights, and the monitor's mean entropy, for one model."""
    torch.manual_seed(0)
    module.train()
    loss = module.training_step(batch, 0).item()
    module.eval()
    plain = [p.probabilities for p in classifier.predict(TEXTS)]
    with_weights = classifier.predict(TEXTS, attention=True)
    health = AttentionHealth()
    with torch.no_grad():
        health.update(module.model(batch["input_ids"], batch["padding_mask"], need_weights=True).attention,
                      batch["padding_mask"])
    return loss, plain, [p.probabilities for p in with_weights], health.compute().entropy.mean().item()


def test_an_edit_of_the_formula_reaches_training_prediction_and_monitor_alike(monkeypatch):
    tokenizer = train_tokenizer(TEXTS, vocab_size=50, max_length=16)
    torch.manual_seed(0)
    network = NetworkConfig(vocab_size=50, num_classes=2, max_length=16, d_model=16, n_heads=2, dropout=0.0,
                            embedding_dropout=0.0)
    module = ClassifierModule(network, label_names=["no", "yes"])
    module.log = module.log_dict = lambda *args, **kwargs: None  # no trainer attached
    classifier = TextClassifier(module.model, tokenizer, ["no", "yes"], device="cpu")
    encodings = [tokenizer.encode(text).ids for text in TEXTS]
    L = max(map(len, encodings))
    input_ids = torch.tensor([ids + [0] * (L - len(ids)) for ids in encodings])
    batch = {"input_ids": input_ids, "padding_mask": input_ids == 0, "labels": torch.tensor([0, 1, 0, 1])}

    before = everything_the_paths_give(module, classifier, batch)
    monkeypatch.setattr(MultiHeadSelfAttention, "attend", sharper(MultiHeadSelfAttention.attend))
    after = everything_the_paths_give(module, classifier, batch)

    loss_before, plain_before, weights_before, entropy_before = before
    loss_after, plain_after, weights_after, entropy_after = after
    assert loss_after != pytest.approx(loss_before, abs=1e-6)  # training sees the edit
    assert plain_after != plain_before  # so does prediction ...
    assert plain_after == weights_after  # ... identically with and without weights handed out
    assert plain_before == weights_before
    assert entropy_after < entropy_before - 0.01  # and the monitor: sharper scores, lower entropy


def test_default_training_never_calls_the_fused_kernel(tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("F.scaled_dot_product_attention was called by default training")

    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    cli = train.main([
        "fit", "--config", str(ROOT / "configs" / "smoke.yaml"), "--data.cache_dir", str(tmp_path / "cache"),
        "--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "5",
        "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
    ])
    assert cli.model.network.attention_kernel == "manual" and cli.trainer.global_step == 5


def test_the_fused_opt_in_does_call_it(tmp_path, monkeypatch):
    calls = []
    original = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    train.main([
        "fit", "--config", str(ROOT / "configs" / "smoke.yaml"), "--data.cache_dir", str(tmp_path / "cache"),
        "--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
        "--trainer.limit_val_batches", "0", "--trainer.enable_progress_bar", "false",
        "--model.network.attention_kernel", "fused",
    ])
    assert len(calls) == 2  # one layer, two training steps
