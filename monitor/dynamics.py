"""Training dynamics, read cheaply from the training batches (no extra forward pass), between two validation passes:

    update_ratio    mean over optimizer steps of ‖W_after − W_before‖ / ‖W_before‖ over every attention projection
                    (W_Q, W_K, W_V, W_O of every layer): how far one step moves the attention weights, relative to
                    their size. Adam moves each weight by about the learning rate, so the ratio is about
                    lr / rms(W): a learning rate 30× too high shows as a ratio 30× the healthy one
    nonfinite_loss  1 when a training loss was NaN or infinite, else 0
    loss_drop       (mean loss of the first half of the batches − of the second half) / the first half: above a few
                    percent the model is still learning
    train_loss      mean training loss since the last validation; prior_loss the loss the same training loss gives
                    a model that always answers the prior of the training labels seen so far (the labels' entropy
                    without class weights; with them, or with several labels a text, that loss's own minimum)
    parameters      {name: why} for each parameter of the trained network that should learn and does not: no
                    gradient reached it at the steps looked at (GRADIENT_STEPS after each validation), the optimizer
                    does not hold it, it did not move since the last validation, requires_grad is off (frozen by
                    design: the fixed position table of positions sinusoidal or none), or it is kept where the
                    network does not register it (a module or tensor in a plain list, dict or tuple attribute); and
                    the network validated (a weight average) when none of its weights followed the one trained

Nothing is moved to the CPU per step: the sums stay tensors on the training device until `summary()`.
"""

import math

import torch
from torch import nn

GRADIENT_STEPS = 4  # optimizer steps after each validation whose gradients are looked at


class TrainingDynamics:
    def __init__(self):
        self.parameters, self.before, self.last_step = [], None, None
        self.named, self.held, self.frozen, self.hidden, self.start = {}, set(), set(), [], None
        self.validated, self.validated_start = [], None  # the network validated, when it is not the one trained
        self.label_counts, self.labelled = None, 0  # over the whole run: the prior the loss is compared with
        self.loss_weights, self.multi_label, self.distillation = None, False, 0.0
        self.reset()

    def reset(self) -> None:
        self.losses, self.ratios, self.nonfinite = [], [], None
        self.texts = 0  # training texts since the last summary
        self.gradient_steps, self.no_gradient = 0, None  # names with no gradient at every step looked at
        self.start = None if not self.named else [p.detach().clone() for p in self.named.values()]
        self.validated_start = [p.detach().clone() for p in self.validated] or None

    def watch(self, pl_module) -> None:
        """The attention projections of the network the optimizer trains (`online_model` when there is one)."""
        network = getattr(pl_module, "online_model", pl_module.model)
        self.parameters = [linear.weight for block in network.blocks
                           for linear in (block.attention.w_q, block.attention.w_k, block.attention.w_v,
                                          block.attention.w_o)
                           if linear is not None]  # a user's class may have none of them by name
        self.before = None
        self.named = dict(network.named_parameters())
        optimizers = getattr(getattr(pl_module, "_trainer", None), "optimizers", None) or []
        self.held = {id(p) for optimizer in optimizers for group in optimizer.param_groups for p in group["params"]}
        config = getattr(network, "config", None)
        fixed = {"position_embedding.weight"} if getattr(config, "positions", "learned") != "learned" else set()
        self.frozen = {name for name, p in self.named.items() if not p.requires_grad and name not in fixed}
        self.named = {name: p for name, p in self.named.items() if p.requires_grad}
        self.hidden = unregistered(network)
        # A weight average (ema_decay) is validated and saved instead of the network trained: it must follow it.
        validated = getattr(pl_module, "model", network)
        self.validated = [] if validated is network else list(validated.parameters())
        # What the training loss is made of, so that guessing the prior is measured by the same loss.
        hparams = getattr(pl_module, "hparams", {})
        self.loss_weights = getattr(pl_module, "loss_weights", None)
        self.multi_label = bool(hparams.get("multi_label", False))
        self.distillation = float(hparams.get("distillation", 0.0) or 0.0)
        self.reset()

    @torch.no_grad()
    def gradients(self) -> None:
        """Before an optimizer step (gradients in place): which parameters got none, at the first GRADIENT_STEPS."""
        if self.gradient_steps >= GRADIENT_STEPS or not self.named:
            return
        self.gradient_steps += 1
        # Exactly zero everywhere counts as none: a gradient that never varies is no learning signal (one sync per
        # step looked at, on a few steps only).
        none = {name for name, p in self.named.items() if p.grad is None or not bool(p.grad.any())}
        self.no_gradient = none if self.no_gradient is None else self.no_gradient & none

    def count_labels(self, labels: torch.Tensor, classes: int) -> None:
        if labels.ndim == 2:  # several labels a text (multi-hot): texts carrying each label
            counts = labels.detach().sum(0).long()
        else:
            counts = torch.bincount(labels.detach().flatten(), minlength=classes)
        self.label_counts = counts if self.label_counts is None else self.label_counts + counts
        self.labelled += len(labels)

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
            "prior_loss": self.prior_loss(),
            "parameters": self.stuck(),
        }
        self.reset()
        return figures

    def stuck(self) -> dict[str, str]:
        """{parameter name: why it does not learn} since the last validation (see the module docstring)."""
        found = {name: "requires_grad is off" for name in sorted(self.frozen)}
        found |= {name: "kept in a plain Python container, so the optimizer never sees it" for name in self.hidden}
        if self.held:
            found |= {name: "the optimizer does not hold it" for name, p in self.named.items() if id(p) not in self.held}
        found |= {name: "no gradient reaches it" for name in sorted(self.no_gradient or ())}
        if self.start is not None and self.ratios:  # at least one optimizer step since the last validation
            still = {name for (name, p), before in zip(self.named.items(), self.start)
                     if torch.equal(p.detach(), before)}
            # Not one parameter moved: the steps themselves were empty (a learning rate at 0, a schedule run out).
            why = ("the optimizer never moved it, nor any other parameter: a learning rate of 0 (a schedule that has "
                   "run out?)" if still and len(still) == len(self.named) else "the optimizer never moved it")
            found |= {name: why for name in self.named if name in still and name not in found}
            if self.validated_start and all(torch.equal(p.detach(), before)
                                            for p, before in zip(self.validated, self.validated_start)):
                found["model (the network validated and saved)"] = (
                    "not one of its weights moved while the network trained did: the copy validated is never "
                    "updated from the one trained (a weight average whose update is not called?)")
        return found


    def prior_loss(self) -> float:
        """The training loss of a model that always answers the class prior of the labels seen so far, by the loss
        the module trains with: class weights and several labels a text included (with distillation, mixed with
        the teacher's part the same way)."""
        if self.label_counts is None or self.labelled == 0:
            return math.nan
        counts, weights = self.label_counts.double().cpu(), self.loss_weights
        weights = None if weights is None else weights.double().cpu()
        if self.multi_label:
            return multi_label_prior_loss(counts, self.labelled, weights)
        hard = weighted_prior_entropy(counts, weights)
        return (1 - self.distillation) * hard + self.distillation * prior_entropy(counts)


def weighted_prior_entropy(counts: torch.Tensor, weights: torch.Tensor | None) -> float:
    """min over constant p of mean_i w_{y_i} · −log p_{y_i}: (Σ n w / N) · H(q), q ∝ n w (q: the shares when every
    weight is 1)."""
    if weights is None:
        return prior_entropy(counts)
    weighted = counts * weights
    return float(weighted.sum() / counts.sum()) * prior_entropy(weighted)


def multi_label_prior_loss(positives: torch.Tensor, texts: int, pos_weight: torch.Tensor | None) -> float:
    """min over constant p of the binary cross-entropy averaged over the labels, each label's positives weighted by
    pos_weight: label c with rate r has its best p = w r / (w r + 1 − r)."""
    rate = (positives / texts).clamp(0.0, 1.0)
    w = torch.ones_like(rate) if pos_weight is None else pos_weight
    p = (w * rate / (w * rate + 1 - rate)).clamp(1e-12, 1 - 1e-12)
    return float((-(w * rate * p.log() + (1 - rate) * (1 - p).log())).mean())


def prior_entropy(counts: torch.Tensor | None) -> float:
    """Entropy (nats) of the class shares of `counts`: the cross-entropy of always predicting the prior."""
    if counts is None or counts.sum() == 0:
        return math.nan
    share = counts.double() / counts.sum()
    return float(-(share * share.clamp(min=1e-300).log()).sum())


def unregistered(network: nn.Module) -> list[str]:
    """Modules and trainable tensors kept in a plain list, tuple or dict attribute of a module: the network does
    not register them, so no optimizer built on its parameters sees them."""
    found = []
    for prefix, module in network.named_modules():
        for attribute, value in vars(module).items():
            if attribute.startswith("_") or not isinstance(value, (list, tuple, dict)):
                continue
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                trainable = isinstance(item, nn.Module) and any(p.requires_grad for p in item.parameters()) or (
                    isinstance(item, torch.Tensor) and item.requires_grad)
                if trainable:
                    found.append(f"{prefix + '.' if prefix else ''}{attribute}[{key!r}]")
    return found
