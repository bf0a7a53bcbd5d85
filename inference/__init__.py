"""Predictions from a checkpoint, without Lightning: `TextClassifier.from_checkpoint(path).predict(texts)`."""

from inference.classifier import CheckpointError, Prediction, TextClassifier

__all__ = ["TextClassifier", "Prediction", "CheckpointError"]
