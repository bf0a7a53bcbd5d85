"""The training optimizer (training/module.py: adamw_with_warmup) takes the fused AdamW kernel where torch has one,
and moves the weights as torch's plain AdamW does: the same update, one pass over memory instead of several."""

from types import SimpleNamespace

import torch

from model.classifier import AttentionClassifier
from model.config import NetworkConfig
from training.module import adamw_with_warmup, decays


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
