"""The weights of the classes in the training loss (model.class_weights), checked where they are given and chosen
from the training labels when a fit starts."""

import logging
import math

import torch

from data.labels import balanced_weights, class_counts, describe_counts, is_imbalanced
from model.config import ConfigError

log = logging.getLogger(__name__)

# Why `auto` leaves imbalanced classes unweighted, said where a run starts (measured: docs/RESULTS.md).
IMBALANCED_UNWEIGHTED = ("each text weighs the same: on held-out texts as imbalanced as these, balanced weights cost "
                         "accuracy and macro-F1; --model.class_weights balanced where the classes met in use are "
                         "more even")


def check_class_weights(weights, label_names: list[str]) -> None:
    """ConfigError (one line) unless `weights` is auto, balanced, null or one finite number > 0 per class: a weight
    of 0 or below would unlearn or ignore its class, and NaN or inf would make the loss NaN at the first step (blamed
    on nothing)."""
    if weights in (None, "auto", "balanced"):
        return
    if not isinstance(weights, (list, tuple)):
        raise ConfigError(f"model.class_weights must be auto, balanced, null or a list of numbers, got {weights!r}")
    if len(weights) != len(label_names):
        raise ConfigError(f"model.class_weights has {len(weights)} numbers for {len(label_names)} classes "
                          f"({', '.join(label_names)}): give one a class, in that order")
    for name, weight in zip(label_names, weights):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
            raise ConfigError(f"model.class_weights: the weight of class {name!r} is {weight!r}: need a finite "
                              "number > 0 (1 is unweighted)")


def choose_loss_weights(setting, multi_label: bool, data, label_names: list[str], device) -> torch.Tensor | None:
    """Class weights of the training loss from model.class_weights (`setting`) and the training labels of `data`
    (the DataModule), logged; None for an unweighted loss."""
    if setting is None or not hasattr(data, "split"):
        return None
    if isinstance(setting, (list, tuple)):
        log.info("class weights (model.class_weights): %s", list(setting))
        return torch.tensor(setting, dtype=torch.float32, device=device)
    labels = data.split("train").labels
    counts = class_counts(labels, len(label_names))
    sampled = getattr(data, "balanced_sampler", False)
    if sampled and setting == "balanced":  # each would even the classes out: together, a rare class counts twice
        raise ConfigError("model.class_weights balanced and data.balanced_sampler both balance the classes: "
                          "give one (model.class_weights auto leaves the loss unweighted under the sampler)")
    if setting == "auto" and sampled:
        log.info("class weights: none (model.class_weights auto: data.balanced_sampler draws the classes evenly; "
                 "%s)", describe_counts(counts, label_names))
        return None
    if setting == "auto":
        log.info("class weights: none (model.class_weights auto: %s; %s)", "several labels a text, thresholds "
                 "fitted instead" if multi_label else IMBALANCED_UNWEIGHTED if is_imbalanced(counts, multi_label)
                 else "classes not imbalanced", describe_counts(counts, label_names))
        return None
    weights = balanced_weights(counts, len(labels), multi_label).to(device)
    log.info("class weights balanced (model.class_weights %s; %s): %s", setting, describe_counts(counts, label_names),
             ", ".join(f"{n} {w:.2f}" for n, w in zip(label_names, weights.tolist())))
    return weights
