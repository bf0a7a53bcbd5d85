"""The network, plain PyTorch (no Lightning, no data, no matplotlib): the hand-written attention
(model/attention.py), the classifier around it (model/classifier.py) and its one configuration (model/config.py)."""

from model.attention import AttentionWeights, MultiHeadSelfAttention
from model.classifier import AttentionClassifier, ClassifierOutput
from model.config import ConfigError, NetworkConfig

__all__ = [
    "AttentionClassifier", "AttentionWeights", "ClassifierOutput", "ConfigError", "MultiHeadSelfAttention",
    "NetworkConfig",
]
