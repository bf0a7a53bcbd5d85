"""The formula a reader sees is the formula that trains, for every attention kind: edit `model.attention.attention`
(the one function holding scores → mask → softmax → dropout → weighted sum) and training loss, predictions with
and without weights, and the monitor's figures all follow, for full, local, sparse and linformer alike. The default
kernel never calls torch's fused attention; the opt-in does."""

import pytest
import torch
import torch.nn.functional as F

import model.attention
from conftest import refuses_causal
from data.tokenizer import train_tokenizer
from inference import TextClassifier
from model.config import NetworkConfig
from monitor.contract import contract_checks
from monitor.health import AttentionHealth
from training.module import ClassifierModule

TEXTS = ["alpha beta gamma delta", "beta beta alpha", "gamma delta alpha beta gamma", "delta"]
TEMPERATURE = 4.0
KINDS = dict(window=2, global_tokens=1, projection_length=4)  # small enough that the band and the projection matter


def sharper(original, calls):
    """A user's edit of the formula: every score multiplied by a temperature (q·kᵀ·scale·4), counted."""

    def attention(q, k, v, blocked=None, *, scale, **kwargs):
        calls.append(q.shape)
        return original(q, k, v, blocked, scale=scale * TEMPERATURE, **kwargs)

    return attention


def tiny_model(kind: str, **settings):
    """A one-layer classifier of the kind (one layer: sharper scores then give lower entropy, exactly), its
    TextClassifier, and a training batch of TEXTS padded from their lengths."""
    tokenizer = train_tokenizer(TEXTS, vocab_size=50, max_length=16)
    torch.manual_seed(0)
    network = NetworkConfig(vocab_size=50, num_classes=2, max_length=16, d_model=16, n_heads=2, dropout=0.0,
                            embedding_dropout=0.0, attention=kind, **KINDS, **settings)
    module = ClassifierModule(network, label_names=["no", "yes"])
    module.log = module.log_dict = lambda *args, **kwargs: None  # no trainer attached
    classifier = TextClassifier(module.model, tokenizer, ["no", "yes"], device="cpu")
    encodings = [tokenizer.encode(text).ids for text in TEXTS]
    lengths = torch.tensor([len(ids) for ids in encodings])
    input_ids = torch.tensor([ids + [0] * (int(lengths.max()) - len(ids)) for ids in encodings])
    padding_mask = torch.arange(input_ids.shape[1]) >= lengths[:, None]
    batch = {"input_ids": input_ids, "padding_mask": padding_mask, "labels": torch.tensor([0, 1, 0, 1])}
    return module, classifier, batch


def everything_the_paths_give(module, classifier, batch):
    """Training loss, predictions without and with weights, and the monitor's mean entropy, for one model."""
    torch.manual_seed(0)
    module.train()
    loss = module.training_step(batch, 0).item()
    module.eval()
    plain = [p.probabilities for p in classifier.predict(TEXTS)]
    with_weights = classifier.predict(TEXTS, attention=True)
    module.keep_validation_attention = True  # as the monitor sets it: validation_step hands out the attention
    health = AttentionHealth()
    with torch.no_grad():
        health.update(module.validation_step(batch, 0)["attention"], batch["padding_mask"])
    return loss, plain, [p.probabilities for p in with_weights], health.compute().entropy.mean().item()


def test_an_edit_of_the_formula_reaches_training_prediction_and_monitor_alike(registered_kind, monkeypatch):
    module, classifier, batch = tiny_model(registered_kind)
    before = everything_the_paths_give(module, classifier, batch)
    calls = []
    monkeypatch.setattr(model.attention, "attention", sharper(model.attention.attention, calls))
    after = everything_the_paths_give(module, classifier, batch)

    loss_before, plain_before, weights_before, entropy_before = before
    loss_after, plain_after, weights_after, entropy_after = after
    assert calls  # the kind went through the one function ...
    assert loss_after != pytest.approx(loss_before, abs=1e-6)  # ... so training sees the edit
    assert plain_after != plain_before  # so does prediction ...
    assert plain_after == weights_after  # ... identically with and without weights handed out
    assert plain_before == weights_before
    assert entropy_after < entropy_before - 0.01  # and the monitor: sharper scores, lower entropy


@pytest.mark.parametrize("causal", [False, True])
def test_no_kind_calls_the_fused_kernel_by_default(registered_kind, causal, monkeypatch):
    """Every path of the LightningModule, the TextClassifier and the layer, forward and backward."""
    if causal and refuses_causal(registered_kind):
        pytest.skip(f"{registered_kind} refuses the look-ahead mask")

    def refuse(*args, **kwargs):
        raise AssertionError("F.scaled_dot_product_attention was called with the default kernel")

    monkeypatch.setattr(F, "scaled_dot_product_attention", refuse)
    module, classifier, batch = tiny_model(registered_kind, causal=causal, pooling="mean")
    contract_checks(module.model, [batch])  # the monitor's recomputed reference runs in default training too
    module.train()
    module.training_step(batch, 0).backward()
    module.eval()
    module.validation_step(batch, 0)
    classifier.predict(TEXTS)
    classifier.predict(TEXTS, attention=True)
    layer = module.model.blocks[0].attention.train()  # and the layer's padded path, which the classifier leaves
    x = torch.randn(*batch["input_ids"].shape, 16)
    layer(x, key_padding_mask=batch["padding_mask"])[0].sum().backward()


def test_a_whole_default_training_run_never_calls_the_fused_kernel(smoke_run):
    assert smoke_run.cli.model.network.attention_kernel == "manual" and smoke_run.fused_calls == 0
    assert smoke_run.cli.trainer.global_step > 0


def test_the_fused_opt_in_does_call_it_and_only_where_no_weights_are_asked_for(monkeypatch):
    calls = []
    original = F.scaled_dot_product_attention

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    module, classifier, batch = tiny_model("full", attention_kernel="fused")
    module.train()
    module.training_step(batch, 0).backward()
    assert len(calls) == 1  # one layer, one training step
    module.eval()
    classifier.predict(TEXTS, attention=True)  # weights asked for: the written lines, never the fused kernel
    assert len(calls) == 1
