"""The probabilities every face gives, one formula: predict, serve, the ensemble's members, the explanations and
their page, and the ONNX export (it traces TextClassifier.probabilities into its `probabilities` output)."""

import torch


def calibrated(logits: torch.Tensor, multi_label: bool, temperature: float) -> torch.Tensor:
    """(B, C) probabilities of logits (B, C): a sigmoid per label (several labels a text), or
    softmax(logits / temperature), the temperature fitted on validation (training/calibration.py)."""
    if multi_label:
        return logits.float().sigmoid()
    return (logits.float() / temperature).softmax(dim=-1)
