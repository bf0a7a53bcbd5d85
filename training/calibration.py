"""What a probability and a label set mean, fitted and measured on a whole split's outputs (plain torch and
torchmetrics, no Lightning): temperature scaling, per-label thresholds, expected calibration error, per-class
precision/recall/F1 and the confusion matrix, and their two figures.

Temperature scaling (Guo et al. 2017): one number T divides the logits, fitted to minimise the negative
log-likelihood on validation; argmax and accuracy are unchanged, only how sure the probabilities are.
Thresholds (several labels a text): each label's cut on its sigmoid probability, one with the best F1 on validation
(the middle of the best cuts of THRESHOLD_GRID): a rare label's best cut is far below 0.5.
"""

import torch
import torch.nn.functional as F
from torchmetrics.functional.classification import (
    binary_calibration_error, multiclass_calibration_error, multiclass_confusion_matrix, multiclass_f1_score,
    multiclass_precision, multiclass_recall, multilabel_exact_match, multilabel_f1_score, multilabel_precision,
    multilabel_recall,
)

from data.checkpoint import TEMPERATURE_RANGE

ECE_BINS = 15  # Guo et al.'s number of equal-width confidence bins
THRESHOLD_GRID = torch.arange(0.02, 0.99, 0.01)


def fit_temperature(logits: torch.Tensor, labels: torch.Tensor, steps: int = 100) -> float:
    """T > 0 minimising cross-entropy(logits / T, labels); fitted as log T so it stays positive."""
    logits, labels = logits.double(), labels.long()
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(logits / log_t.exp(), labels)
        loss.backward()
        return loss

    optimizer.step(closure)
    temperature = float(log_t.detach().exp())
    low, high = TEMPERATURE_RANGE  # the range a checkpoint's stored temperature is checked against
    return temperature if low <= temperature <= high else 1.0  # a degenerate fit (one class only): no scaling


def fit_thresholds(probabilities: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """Per label, a cut with the best F1 on these (N, C) probabilities; 0.5 for a label without a positive here (its
    F1 is 0 whatever the cut).

    Many cuts of THRESHOLD_GRID often tie: every cut between the same two validation probabilities makes the same
    answers. The cut chosen is the middle of the widest run of neighbouring best cuts (the lowest such run if two
    are as wide), as far as the grid allows from the validation texts on either side, so a new text a little less
    or a little more sure than those is answered as they were. The lowest best cut would sit just above a negative
    text and take in any new text barely surer than it."""
    grid = THRESHOLD_GRID.to(probabilities)
    predicted = probabilities.unsqueeze(-1) >= grid  # (N, C, T)
    truth = labels.bool().unsqueeze(-1)
    tp = (predicted & truth).sum(0).float()  # (C, T)
    fp = (predicted & ~truth).sum(0).float()
    fn = (~predicted & truth).sum(0).float()
    f1 = 2 * tp / (2 * tp + fp + fn).clamp(min=1)
    best = f1 >= f1.max(-1, keepdim=True).values - 1e-6  # (C, T): the cuts tied at the best F1
    cuts = []
    for row, has_positive in zip(best.tolist(), (labels.sum(0) > 0).tolist()):
        if not has_positive:
            cuts.append(0.5)
            continue
        runs, start = [], None  # (length, first, last) of each run of neighbouring best cuts
        for i, tied in enumerate(row + [False]):
            if tied and start is None:
                start = i
            elif not tied and start is not None:
                runs.append((i - start, -start, i - 1))
                start = None
        _, first, last = max(runs)
        cuts.append(round(float(grid[-first] + grid[last]) / 2, 4))
    return cuts


def label_sets(probabilities: torch.Tensor, thresholds) -> torch.Tensor:
    """(N, C) 0/1: the labels whose probability reaches their threshold."""
    return (probabilities >= torch.as_tensor(thresholds, dtype=probabilities.dtype, device=probabilities.device)).long()


def expected_calibration_error(probabilities: torch.Tensor, labels: torch.Tensor, multi_label: bool) -> float:
    """ECE over ECE_BINS bins: of the most likely class (one label a text), or of every (text, label) yes/no
    (several labels a text)."""
    if multi_label:
        return float(binary_calibration_error(probabilities.flatten(), labels.long().flatten(), n_bins=ECE_BINS))
    return float(multiclass_calibration_error(probabilities, labels.long(), probabilities.shape[-1], n_bins=ECE_BINS))


def scores(probabilities: torch.Tensor, labels: torch.Tensor, multi_label: bool, thresholds=None) -> dict:
    """Split-level figures: acc (subset accuracy with several labels a text), f1 (macro), micro_f1 (several
    labels), and per class precision, recall, f1 and support."""
    n = probabilities.shape[-1]
    if multi_label:
        predicted, target = label_sets(probabilities, 0.5 if thresholds is None else thresholds), labels.long()
        figures = {"acc": multilabel_exact_match(predicted, target, n),
                   "f1": multilabel_f1_score(predicted, target, n, average="macro"),
                   "micro_f1": multilabel_f1_score(predicted, target, n, average="micro")}
        per_class = [multilabel_precision(predicted, target, n, average=None),
                     multilabel_recall(predicted, target, n, average=None),
                     multilabel_f1_score(predicted, target, n, average=None), target.sum(0)]
    else:
        predicted, target = probabilities.argmax(-1), labels.long()
        figures = {"acc": (predicted == target).float().mean(),
                   "f1": multiclass_f1_score(predicted, target, n, average="macro")}
        per_class = [multiclass_precision(predicted, target, n, average=None),
                     multiclass_recall(predicted, target, n, average=None),
                     multiclass_f1_score(predicted, target, n, average=None), torch.bincount(target, minlength=n)]
    figures = {name: float(value) for name, value in figures.items()}
    figures["per_class"] = torch.stack([t.float() for t in per_class], dim=1)  # (C, 4): precision, recall, F1, support
    return figures


def per_class_table(per_class: torch.Tensor, names: list[str]) -> str:
    """Per-class precision/recall/F1/support as aligned text lines (train.py validate/test prints it)."""
    width = max(8, *(len(name) for name in names))
    lines = [f"{'class':<{width}}  precision  recall     f1  support"]
    for name, (p, r, f, support) in zip(names, per_class.tolist()):
        lines.append(f"{name:<{width}}  {p:9.3f}  {r:6.3f}  {f:5.3f}  {int(support):7d}")
    return "\n".join(lines)


def confusion(probabilities: torch.Tensor, labels: torch.Tensor, multi_label: bool, thresholds=None) -> torch.Tensor:
    """(C, C) counts, true class × predicted; several labels a text: (C, 2, 2) per label [[TN, FP], [FN, TP]]."""
    n = probabilities.shape[-1]
    if multi_label:
        predicted, target = label_sets(probabilities, 0.5 if thresholds is None else thresholds), labels.long()
        tp = (predicted & target).sum(0)
        fp = (predicted & (1 - target)).sum(0)
        fn = ((1 - predicted) & target).sum(0)
        tn = len(target) - tp - fp - fn
        return torch.stack([torch.stack([tn, fp], -1), torch.stack([fn, tp], -1)], -2)
    return multiclass_confusion_matrix(probabilities.argmax(-1), labels.long(), n)


def confusion_figure(matrix: torch.Tensor, names: list[str], title: str):
    """The confusion matrix as an image: rows true, columns predicted, each row scaled to its class's texts; with
    several labels a text, per label the share of its texts found (recall) and of its predictions right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(names)
    if matrix.ndim == 3:  # per label: recall and precision side by side
        tp, fp, fn = matrix[:, 1, 1].float(), matrix[:, 0, 1].float(), matrix[:, 1, 0].float()
        shares = torch.stack([tp / (tp + fn).clamp(min=1), tp / (tp + fp).clamp(min=1)], 1)
        figure, axes = plt.subplots(figsize=(3.2, 0.25 * n + 1.2))
        axes.imshow(shares, vmin=0, vmax=1, cmap="Blues", aspect="auto")
        axes.set_xticks([0, 1], ["recall", "precision"])
        axes.set_yticks(range(n), names, fontsize=7)
    else:
        rows = matrix.float() / matrix.sum(1, keepdim=True).clamp(min=1)
        figure, axes = plt.subplots(figsize=(0.35 * n + 2.2, 0.35 * n + 1.8))
        axes.imshow(rows, vmin=0, vmax=1, cmap="Blues")
        axes.set_xticks(range(n), names, rotation=90, fontsize=7)
        axes.set_yticks(range(n), names, fontsize=7)
        axes.set_xlabel("predicted")
        axes.set_ylabel("true")
        if n <= 12:
            for i in range(n):
                for j in range(n):
                    axes.text(j, i, int(matrix[i, j]), ha="center", va="center", fontsize=7,
                              color="white" if rows[i, j] > 0.5 else "black")
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    return figure


def reliability_figure(probabilities: torch.Tensor, labels: torch.Tensor, multi_label: bool, title: str):
    """Reliability diagram: per confidence bin, the share right against the confidence (the diagonal is
    calibrated), bars as wide as the bin, with the texts per bin beneath."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if multi_label:
        confidence, right = probabilities.flatten(), labels.flatten().float()
    else:
        confidence, predicted = probabilities.max(-1)
        right = (predicted == labels.long()).float()
    edges = torch.linspace(0, 1, ECE_BINS + 1)
    # Bins (lo, hi]: torch's right=False, so a confidence of exactly 1 falls in the last bin, not past it.
    bins = torch.bucketize(confidence.clamp(1e-6, 1), edges, right=False) - 1
    counts = torch.bincount(bins, minlength=ECE_BINS).float()
    accuracy = torch.bincount(bins, weights=right, minlength=ECE_BINS) / counts.clamp(min=1)
    figure, axes = plt.subplots(figsize=(4, 4))
    centres = (edges[:-1] + edges[1:]) / 2
    axes.bar(centres, accuracy, width=1 / ECE_BINS, edgecolor="black", alpha=0.7, label="share right")
    axes.plot([0, 1], [0, 1], "--", color="grey", label="calibrated")
    axes.set_xlabel("confidence" + (" (each label)" if multi_label else ""))
    axes.set_ylabel("share right")
    axes.set_xlim(0, 1)
    axes.set_ylim(0, 1)
    axes.legend(loc="upper left", fontsize=8)
    axes.set_title(title, fontsize=9)
    figure.tight_layout()
    return figure
