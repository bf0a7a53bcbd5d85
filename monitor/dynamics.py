"""Training dynamics, read cheaply from the training batches (no extra forward pass), between two validation passes:

    update_ratio    mean over optimizer steps of ‖W_after − W_before‖ / ‖W_before‖ over every attention projection
                    (W_Q, W_K, W_V, W_O of every layer): how far one step moves the attention weights, relative to
                    their size. Adam moves each weight by about the learning rate, so the ratio is about
                    lr / rms(W): a learning rate 30× too high shows as a ratio 30× the healthy one
    nonfinite_loss  1 when a training loss was NaN or infinite, else 0
    loss_drop       (mean loss of the first half of the batches − of the second half) / the first half: above a few
                    percent the model is still learning

Nothing is moved to the CPU per step: the sums stay tensors on the training device until `summary()`.
"""

import math

import torch


class TrainingDynamics:
    def __init__(self):
        self.parameters, self.before, self.last_step = [], None, None
        self.reset()

    def reset(self) -> None:
        self.losses, self.ratios, self.nonfinite = [], [], None
        self.texts = 0  # training texts since the last summary

    def watch(self, pl_module) -> None:
        """The attention projections of the network the optimizer trains (`online_model` when there is one)."""
        network = getattr(pl_module, "online_model", pl_module.model)
        self.parameters = [linear.weight for block in network.blocks
                           for linear in (block.attention.w_q, block.attention.w_k, block.attention.w_v,
                                          block.attention.w_o)]
        self.before = None

    @torch.no_grad()
    def update(self, outputs, step: int, texts: int = 0) -> None:
        """After a training batch of `texts` texts: its loss, and the update ratio when an optimizer step was taken
        since the last."""
        self.texts += texts
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if torch.is_tensor(loss):
            loss = loss.detach().float()
            finite = torch.isfinite(loss)
            self.nonfinite = ~finite if self.nonfinite is None else self.nonfinite | ~finite
            self.losses.append(loss)
        if not self.parameters:
            return
        if self.before is not None and step != self.last_step:
            moved = sum((p - b).square().sum() for p, b in zip(self.parameters, self.before))
            size = sum(b.square().sum() for b in self.before)
            self.ratios.append((moved / size.clamp(min=1e-30)).sqrt())
        if self.before is None or step != self.last_step:
            self.before = [p.detach().clone() for p in self.parameters]
            self.last_step = step

    def summary(self) -> dict:
        """The figures since the last summary (empty when no training batch came: a validate run); resets."""
        if not self.losses:
            return {}
        losses = torch.stack(self.losses).cpu()
        finite = losses[torch.isfinite(losses)]
        half = len(finite) // 2
        first = finite[:half].mean().item() if half else math.nan
        second = finite[half:].mean().item() if half else math.nan
        figures = {
            "update_ratio": torch.stack(self.ratios).mean().item() if self.ratios else math.nan,
            "nonfinite_loss": float(bool(self.nonfinite)),
            "loss_drop": (first - second) / first if half and first > 0 else math.nan,
            "train_loss": finite.mean().item() if len(finite) else math.nan,
        }
        self.reset()
        return figures
