"""The training optimizer (training/optimizer.py: adamw_with_warmup) takes the fused AdamW kernel where torch has one,
and moves the weights as torch's plain AdamW does: the same update, one pass over memory instead of several."""

import math
from types import SimpleNamespace

import pytest
import torch

from model.classifier import AttentionClassifier
from model.config import NetworkConfig
from training.optimizer import adamw_with_warmup, decays


def network() -> AttentionClassifier:
    torch.manual_seed(0)
    return AttentionClassifier(NetworkConfig(vocab_size=50, num_classes=2, max_length=8, d_model=16, n_heads=2,
                                             n_layers=1, d_ff=32))


def train_steps(model, optimizer, count=3):
    for step in range(count):
        generator = torch.Generator().manual_seed(step)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=generator) if p.requires_grad else None
        optimizer.step()


def test_the_fused_optimizer_moves_the_weights_as_plain_adamw():
    fused_network, plain_network, start = network(), network(), network()
    module = SimpleNamespace(hparams=SimpleNamespace(lr=1e-2, weight_decay=0.1, warmup_fraction=0.0),
                             trainer=SimpleNamespace(estimated_stepping_batches=10))
    fused = adamw_with_warmup(module, fused_network)["optimizer"]
    assert all(group["fused"] for group in fused.param_groups)  # a CPU torch >= 2.4 has the kernel
    named = list(plain_network.named_parameters())
    plain = torch.optim.AdamW([{"params": [p for n, p in named if decays(n, p)], "weight_decay": 0.1},
                               {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0}],
                              lr=1e-2, foreach=False)
    train_steps(fused_network, fused)
    train_steps(plain_network, plain)
    for (name, a), b, before in zip(fused_network.named_parameters(), plain_network.parameters(), start.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
        assert not a.requires_grad or not torch.equal(a, before), f"{name} did not move"


def hand_schedule(step: int, total: int, warmup: int) -> float:
    """The schedule the published figures were trained with: linear warm-up to the full rate over `warmup` steps,
    then a cosine to zero at step `total`."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))


@pytest.mark.parametrize(("total", "warmup_fraction"), [(1, 0.05), (2, 0.5), (10, 0.0), (10, 0.3), (7, 1.0),
                                                         (100, 0.05), (1000, 0.05), (2001, 0.1)])
def test_the_schedule_is_the_warmup_then_cosine_of_the_published_figures(total, warmup_fraction):
    module = SimpleNamespace(hparams=SimpleNamespace(lr=3e-3, weight_decay=0.1, warmup_fraction=warmup_fraction),
                             trainer=SimpleNamespace(estimated_stepping_batches=total))
    configured = adamw_with_warmup(module, network())
    optimizer, scheduler = configured["optimizer"], configured["lr_scheduler"]["scheduler"]
    warmup = max(1, int(warmup_fraction * total))  # (1, 0.05) and (10, 0.0): a warm-up of one step
    for step in range(total + 1):  # the rate of every step, and the one after the last (zero)
        expected = 3e-3 * hand_schedule(step, total, warmup)
        for group in optimizer.param_groups:
            assert math.isclose(group["lr"], expected, rel_tol=1e-6, abs_tol=1e-12), (step, group["lr"], expected)
        optimizer.step()
        scheduler.step()


def test_a_schedule_saved_by_hand_resumes_at_its_step():
    """Checkpoints of an earlier version hold the schedule as a LambdaLR's state (its step only): a fit resumed from
    one goes on at the rate of that step."""
    total, warmup, step = 50, 5, 17
    module = SimpleNamespace(hparams=SimpleNamespace(lr=3e-3, weight_decay=0.1, warmup_fraction=0.1),
                             trainer=SimpleNamespace(estimated_stepping_batches=total))
    earlier = adamw_with_warmup(module, network())["optimizer"]
    by_hand = torch.optim.lr_scheduler.LambdaLR(earlier, lambda s: hand_schedule(s, total, warmup))
    for _ in range(step):
        earlier.step()
        by_hand.step()
    configured = adamw_with_warmup(module, network())
    configured["optimizer"].load_state_dict(earlier.state_dict())
    configured["lr_scheduler"]["scheduler"].load_state_dict(by_hand.state_dict())
    for moment in range(step, total + 1):
        for group in configured["optimizer"].param_groups:
            assert math.isclose(group["lr"], 3e-3 * hand_schedule(moment, total, warmup), rel_tol=1e-6, abs_tol=1e-12)
        configured["optimizer"].step()
        configured["lr_scheduler"]["scheduler"].step()
