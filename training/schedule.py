"""The learning-rate schedule of every fit: a linear warm-up to the configured rate, then a cosine to zero, from
torch's own schedulers, stepped once per optimizer step.

    scheduler = WarmupThenCosine(optimizer, total_steps=2000, warmup_fraction=0.05)  # 100 steps up, 1,900 down
"""

import warnings

from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR


class WarmupThenCosine(SequentialLR):
    """The rate rises linearly over warmup_fraction of the `total_steps` (at least one step) to the configured one,
    then falls along a cosine to zero at the last step."""

    def __init__(self, optimizer, total_steps: int, warmup_fraction: float):
        total = max(1, total_steps)
        warmup = max(1, int(warmup_fraction * total))
        rise = LinearLR(optimizer, start_factor=1 / warmup, end_factor=1.0, total_iters=warmup - 1)
        fall = CosineAnnealingLR(optimizer, T_max=max(1, total - warmup))
        super().__init__(optimizer, [rise, fall], milestones=[warmup])

    def load_state_dict(self, state_dict: dict) -> None:
        if "lr_lambdas" not in state_dict:
            return super().load_state_dict(state_dict)
        # A checkpoint of an earlier version held the same schedule as a LambdaLR, which stores only its step:
        # walk this one to that step (torch warns of scheduler steps before optimizer steps, as meant here).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(state_dict["last_epoch"]):
                self.step()
