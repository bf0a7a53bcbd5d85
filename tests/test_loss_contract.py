"""The loss contract (monitor/loss_contract.py): a training step's loss against its definition recomputed on the
step's own logits, silent on the module's own loss, naming the usual slips; and its verdict in the doctor."""

import math

import pytest
import torch
import torch.nn.functional as F

from model.config import NetworkConfig
from monitor.doctor import VERDICTS, diagnose, warnings
from monitor.loss_contract import LOSS_STEPS, LossContract
from training.module import ClassifierModule

LENGTHS = torch.tensor([6, 4, 3, 6, 2, 5])
PADDING = torch.arange(6) >= LENGTHS[:, None]
BATCH = {"input_ids": torch.randint(4, 30, (6, 6), generator=torch.Generator().manual_seed(0)).masked_fill(PADDING, 0),
         "padding_mask": PADDING, "labels": torch.tensor([0, 1, 2, 1, 0, 2])}


def module(**settings) -> ClassifierModule:
    torch.manual_seed(0)
    return ClassifierModule(network=NetworkConfig(vocab_size=30, num_classes=3, max_length=6, d_model=16, n_heads=2),
                            **settings)


def steps(pl_module, loss=None, batch=BATCH, count=2) -> dict:
    """`count` training steps' losses as the module computes them (or loss(module, logits, labels)), through the
    contract as the monitor calls it; its summary."""
    contract = LossContract()
    contract.watch(pl_module)
    pl_module.train()
    for _ in range(count):
        contract.before_batch()
        logits = pl_module.online_model(batch["input_ids"], batch["padding_mask"]).logits
        if loss is None:
            used = pl_module.loss(logits, batch["labels"], weight=pl_module.loss_weights,
                                  label_smoothing=pl_module.hparams.label_smoothing).mean()
        else:
            used = loss(logits, batch["labels"])
        contract.after_batch({"loss": used.detach()}, batch)
    return contract.summary()


@pytest.mark.parametrize("settings", [{}, {"label_smoothing": 0.1}])
def test_the_modules_own_loss_keeps_the_contract(settings):
    assert steps(module(**settings)) == {}


def test_class_weights_are_part_of_the_definition():
    pl_module = module()
    pl_module.loss_weights = torch.tensor([0.5, 1.0, 2.0])
    assert steps(pl_module) == {}
    found = steps(pl_module, loss=lambda logits, labels: F.cross_entropy(logits, labels))  # weights forgotten
    assert found["difference"] > 1e-3


@pytest.mark.parametrize("loss, named", [
    (lambda logits, labels: F.cross_entropy(logits.softmax(-1), labels), "probabilities"),
    (lambda logits, labels: F.cross_entropy(logits, labels, reduction="sum"), "a sum"),
    (lambda logits, labels: F.nll_loss(logits.softmax(-1), labels), "log left out"),
])
def test_a_loss_that_is_not_its_definition_is_named(loss, named):
    found = steps(module(), loss=loss)
    assert found["difference"] > 1e-3 and named in found["how"], found


def test_logits_that_are_probabilities_are_named_though_the_loss_matches_them():
    pl_module = module()
    head = pl_module.model.head
    pl_module.model.head = torch.nn.Sequential(head, torch.nn.Softmax(-1))  # a softmax at the end of the network
    found = steps(pl_module)
    assert math.isnan(found["difference"]) and "probabilities already" in found["how"]


def test_only_the_first_steps_after_a_validation_are_recomputed():
    contract = LossContract()
    contract.watch(module())
    for _ in range(LOSS_STEPS + 2):
        contract.before_batch()
        contract.network(BATCH["input_ids"], BATCH["padding_mask"])
        contract.after_batch({"loss": torch.tensor(0.0)}, BATCH)
    assert contract.steps == LOSS_STEPS and contract.summary()
    assert contract.steps == 0 and contract.hook is None  # reset: the next steps are looked at again


def test_the_doctor_gives_loss_broken_with_the_form_found():
    found = steps(module(), loss=lambda logits, labels: F.cross_entropy(logits.softmax(-1), labels))
    (finding,) = [f for f in warnings(diagnose(None, {}, {"loss": found})) if f.verdict == "loss-broken"]
    assert "probabilities" in finding.detail and finding.figures["loss_difference"] > 1e-3
    assert VERDICTS["loss-broken"].severity == "warning"
    assert not [f for f in diagnose(None, {}, {"loss": {}}) if f.verdict == "loss-broken"]
