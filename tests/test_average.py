"""The weight average (training/average.py, torch's AveragedModel) keeps the numbers of the published runs: after each
optimizer step k (0 at the first) every averaged weight moves as a ← a + (1 − d_k)(w − a), d_k = min(decay,
(1 + k)/(10 + k)), from a copy of the network as built."""

import pytest
import torch

from model.classifier import AttentionClassifier
from model.config import NetworkConfig
from training.average import WeightAverage

DECAY = 0.5  # reached by the warm-up at step 8: a few steps test both the warm-up and the setting


def hand_average(start: dict, trained_after_each_step: list[dict], decay: float, warm_up: bool = True) -> dict:
    """The reference, written out: each step's lerp with the (warmed-up) decay."""
    average = {name: p.clone() for name, p in start.items()}
    for step, trained in enumerate(trained_after_each_step):
        d = min(decay, (1 + step) / (10 + step)) if warm_up else decay
        for name, a in average.items():
            a.lerp_(trained[name], 1.0 - d)
    return average


def trained_for(steps: int, average: WeightAverage | None = None):
    """A tiny classifier trained `steps` SGD steps on random texts; its weights after each step (and the average
    updated after each, when given)."""
    torch.manual_seed(0)
    network = AttentionClassifier(NetworkConfig(vocab_size=20, num_classes=3, max_length=8, d_model=8, n_heads=2))
    start = {name: p.detach().clone() for name, p in network.named_parameters()}
    average = WeightAverage(network, DECAY)
    optimizer = torch.optim.SGD(network.parameters(), lr=0.5)
    after = []
    for step in range(steps):
        ids = torch.randint(1, 20, (4, 8))
        loss = torch.nn.functional.cross_entropy(network(ids).logits, torch.randint(0, 3, (4,)))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        average.update(network, step)
        after.append({name: p.detach().clone() for name, p in network.named_parameters()})
    return start, after, average


def test_the_library_average_is_the_hand_written_one_step_by_step():
    start, after, average = trained_for(12)
    got = dict(average.network.named_parameters())
    expected = hand_average(start, after, DECAY)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-6, atol=1e-7)
    # The comparison can fail: the same steps with the decay at its full value from the start (no warm-up), or
    # another decay, give other weights.
    for wrong in (hand_average(start, after, DECAY, warm_up=False), hand_average(start, after, 0.6)):
        assert not torch.allclose(got["head.weight"], wrong["head.weight"], rtol=1e-4, atol=1e-6)


def test_the_average_starts_as_the_network_built_and_is_never_trained():
    start, _, average = trained_for(0)
    assert all(torch.equal(p, start[name]) for name, p in average.network.named_parameters())
    assert not any(p.requires_grad for p in average.network.parameters())


@pytest.mark.parametrize("step, decay", [(0, 0.1), (1, 2 / 11), (7, 8 / 17), (8, 0.5), (10_000, 0.5)])
def test_the_decay_warms_up_to_its_setting(step, decay):
    from training.average import warmed_up_decay

    assert warmed_up_decay(DECAY, step) == pytest.approx(decay)
