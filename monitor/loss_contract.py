"""The loss contract: the loss a training step used equals the loss its figures say, recomputed from that step's own
logits and labels by its definition: cross-entropy of the logits for one label a text, binary cross-entropy of the
logits averaged over the labels for several, with the run's class weights and label smoothing, mixed with the
teacher's part as configured (model.distillation), averaged over the batch.

    contract = LossContract()
    contract.watch(pl_module)                       # at the start of training, and after each validation: reset()
    contract.before_batch()                         # a training batch starts: its forward's logits are kept
    contract.after_batch(outputs, batch, accumulate)  # the step's loss against the definition
    contract.summary()  → {"difference", "how"} or {}

The logits are those the step's own forward pass made (a forward hook on the network the optimizer trains, on the
first LOSS_STEPS batches after each validation), so dropout and token dropout change nothing in the comparison. A
difference is named by the form it matches: the loss of probabilities (a softmax before cross_entropy, or one at the
end of the network), a sum where a mean is meant, a negative log left out.
"""

import math

import torch
# Bound when this module loads: a function patched on torch.nn.functional later (a test's, a planted bug's) changes
# the step's loss, not its definition.
from torch.nn.functional import binary_cross_entropy_with_logits, cross_entropy, nll_loss

LOSS_STEPS = 4  # training batches after each validation whose loss is recomputed
LOSS_TOLERANCE = 1e-3  # relative: float32 rounding of the same loss ≤ 1e-6; cross-entropy of probabilities 0.013
# at the smoke run's first steps (logits near 0 make the two losses close), more as the logits grow


class LossContract:
    def __init__(self):
        self.network, self.hook, self.logits = None, None, None
        self.multi_label, self.smoothing, self.weights, self.distillation = False, 0.0, None, 0.0
        self.reset()

    def reset(self) -> None:
        self.steps, self.worst = 0, None

    def watch(self, pl_module) -> None:
        """The network the optimizer trains and the loss settings of the module (a classifier: one with labels)."""
        hparams = getattr(pl_module, "hparams", {})
        classifier = getattr(pl_module, "label_names", None) is not None
        self.network = getattr(pl_module, "online_model", pl_module.model) if classifier else None
        self.multi_label = bool(hparams.get("multi_label", False))
        self.smoothing = float(hparams.get("label_smoothing", 0.0) or 0.0)
        self.distillation = float(hparams.get("distillation", 0.0) or 0.0)
        self.weights = getattr(pl_module, "loss_weights", None)
        self.reset()

    def before_batch(self) -> None:
        if self.network is None or self.steps >= LOSS_STEPS or self.hook is not None:
            return
        self.logits = None

        def keep(module, inputs, output):
            self.logits = getattr(output, "logits", None)

        self.hook = self.network.register_forward_hook(keep)

    @torch.no_grad()
    def after_batch(self, outputs, batch: dict, accumulate: int = 1) -> None:
        """The step's loss (Lightning divides it by the batches accumulated per optimizer step) against the
        definition recomputed on the logits its forward pass made."""
        if self.hook is None:
            return
        self.hook.remove()
        self.hook, logits = None, self.logits
        used = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if logits is None or not torch.is_tensor(used) or "labels" not in batch or not torch.isfinite(used):
            return
        if self.distillation and "teacher_probs" not in batch:
            return
        self.steps += 1
        used = float(used) * accumulate
        result = compare(used, logits.detach().float(), batch, self)
        if result is not None and (self.worst is None or result["difference"] > self.worst["difference"]):
            self.worst = result

    def summary(self) -> dict:
        """{"difference", "how"} of the step that differed most since the last summary, {} when none did; resets."""
        found = self.worst or {}
        self.reset()
        return found


def definition(logits, batch, settings, probabilities=False, reduce="mean") -> float:
    """The run's loss on these logits (probabilities=True: fed their softmax or sigmoid, as the mistake does)."""
    labels = batch["labels"]
    if settings.multi_label:
        inputs = logits.sigmoid() if probabilities else logits
        per_text = binary_cross_entropy_with_logits(inputs, labels.float(), pos_weight=settings.weights,
                                                      reduction="none").mean(-1)
    else:
        inputs = logits.softmax(-1) if probabilities else logits
        per_text = cross_entropy(inputs, labels, weight=settings.weights, label_smoothing=settings.smoothing,
                                   reduction="none")
    loss = per_text.sum() if reduce == "sum" else per_text.mean()
    if settings.distillation:
        alpha = settings.distillation
        teacher = cross_entropy(inputs, batch["teacher_probs"].float(), reduction="none")
        loss = (1 - alpha) * loss + alpha * (teacher.sum() if reduce == "sum" else teacher.mean())
    return float(loss)


def compare(used: float, logits: torch.Tensor, batch: dict, settings) -> dict | None:
    """None when the loss used is the definition's; else {"difference" (relative), "how"}."""
    expected = definition(logits, batch, settings)
    if not settings.multi_label and logits_are_probabilities(logits):  # the definition itself is then fed them
        return {"difference": math.nan, "used": used, "expected": expected,
                "how": "the network's logits are probabilities already (rows ≥ 0 summing to 1: a softmax at its "
                       "end), and cross_entropy applies another softmax to them"}
    difference = abs(used - expected) / max(abs(expected), 1e-12)
    if difference < LOSS_TOLERANCE:
        return None
    probabilities = ("the loss of probabilities: binary_cross_entropy_with_logits fed sigmoid(logits), so the "
                     "sigmoid is applied twice" if settings.multi_label else
                     "the loss of probabilities: cross_entropy fed softmax(logits), so the softmax is applied twice")
    forms = {
        probabilities: definition(logits, batch, settings, probabilities=True),
        "a sum over the batch where a mean is meant": definition(logits, batch, settings, reduce="sum"),
    }
    if not settings.multi_label:
        forms["the negative log left out: nll_loss of probabilities"] = float(
            nll_loss(logits.softmax(-1), batch["labels"]))
    how = next((name for name, value in forms.items()
                if abs(used - value) <= LOSS_TOLERANCE * max(abs(value), 1e-12)), None)
    detail = how or "it matches none of the usual slips (probabilities, a sum, a missing log)"
    return {"difference": difference, "used": used, "expected": expected,
            "how": f"the step's loss {used:.4g}, its definition on the same logits {expected:.4g}: {detail}"}


def logits_are_probabilities(logits: torch.Tensor) -> bool:
    """Rows of two classes or more that are non-negative and sum to 1: a linear head does not give those."""
    return logits.shape[-1] >= 2 and bool((logits >= 0).all()) and bool(((logits.sum(-1) - 1).abs() < 1e-4).all())
