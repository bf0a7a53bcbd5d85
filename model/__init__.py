"""The network: hand-written attention (model/attention.py), the classifier around it, and its Lightning wrapper."""

from model.attention import MultiHeadSelfAttention
from model.classifier import AttentionClassifier

__all__ = ["MultiHeadSelfAttention", "AttentionClassifier", "TextClassifier", "Prediction", "CheckpointError"]

INFERENCE_NAMES = ("TextClassifier", "Prediction", "CheckpointError")


def __getattr__(name):
    # Imported on first use, so `import model` stays as light as the network itself.
    if name in INFERENCE_NAMES:
        from model import inference

        return getattr(inference, name)
    raise AttributeError(f"module 'model' has no attribute {name!r}")
