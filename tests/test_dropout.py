"""model/dropout.py: nn.Dropout's numbers bit for bit (outputs, gradients, the generator's state after), drawn with
torch.rand."""

import pytest
import torch
from torch import nn

from model.dropout import Dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9])
@pytest.mark.parametrize("shape", [(684, 128), (7, 3, 5), (1,)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_same_numbers_as_nn_dropout(p, shape, dtype):
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    results = []
    for layer in (nn.Dropout(p), Dropout(p)):
        torch.manual_seed(7)
        out = layer(x)
        grad, = torch.autograd.grad((out * torch.arange(out.numel()).view(out.shape)).sum(), x)
        results.append((out, grad, torch.rand(4)))  # the generator's next draws: the state after
    (out, grad, after), (ours, our_grad, our_after) = results
    assert torch.equal(out, ours) and torch.equal(grad, our_grad) and torch.equal(after, our_after)
    assert 0 < int((ours == 0).sum()) < ours.numel() or ours.numel() < 10  # something dropped, something kept


def test_evaluation_the_edges_and_other_dtypes_are_nn_dropout_itself():
    x = torch.randn(64, 32)
    assert Dropout(0.3).eval()(x) is x
    assert Dropout(0.0)(x) is x  # nn.Dropout(0.0) hands the input back as well
    assert torch.equal(Dropout(1.0)(x), torch.zeros_like(x))
    half = torch.randn(16, 16, dtype=torch.bfloat16)
    torch.manual_seed(3)
    theirs = nn.Dropout(0.2)(half)
    torch.manual_seed(3)
    assert torch.equal(Dropout(0.2)(half), theirs)
    assert isinstance(Dropout(0.1), nn.Dropout)
