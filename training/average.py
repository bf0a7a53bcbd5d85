"""The weight average (model.ema_decay): an exponential moving average of the network the optimizer trains, kept
by torch's AveragedModel with its EMA update (get_ema_multi_avg_fn). It is what validation, the monitor and the
checkpoint's `model` see; the network trained is the module's `online_model`."""

import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn


def warmed_up_decay(decay: float, step: int) -> float:
    """The decay at optimizer step `step` (0 at the first): the usual warm-up (TensorFlow's ExponentialMovingAverage
    num_updates), so early on the average follows the fast-moving weights instead of dragging their random start."""
    return min(decay, (1 + step) / (10 + step))


class WeightAverage:
    """`network` (the average, a copy of `trained` as built) moved towards `trained` after each optimizer step.

    Not an nn.Module of its own: the module registers `network` as its `model`, so the checkpoint keeps the average
    under `model.*` (what predict, diagnose and export read) and the trained network under its own name."""

    def __init__(self, trained: nn.Module, decay: float):
        self.decay, self.step = decay, 0
        # use_buffers=False: only the parameters are averaged (the buffers are fixed tables, copied as built).
        self.averaged = AveragedModel(trained, multi_avg_fn=self._update, use_buffers=False)
        self.averaged.n_averaged += 1  # the copy just made is the average's first value, not one to overwrite
        self.network = self.averaged.module.requires_grad_(False)  # never trained (DDP must not wait for it)

    @torch.no_grad()
    def update(self, trained: nn.Module, step: int) -> None:
        """After optimizer step `step` (the count before it: 0 at the first), never per micro-batch."""
        self.step = step
        self.averaged.update_parameters(trained)

    def _update(self, averaged, current, n_averaged):
        get_ema_multi_avg_fn(warmed_up_decay(self.decay, self.step))(averaged, current, n_averaged)


def networks(module) -> list:
    """The networks a ClassifierModule holds: `model`, and with ema_decay the `online_model` it averages (once each:
    without an average they are one network)."""
    return list({id(network): network for network in (module.model, module.online_model)}.values())
