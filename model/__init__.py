"""The network, plain PyTorch (no Lightning, no data, no matplotlib): the hand-written attention
(model/attention.py: `attention()`, the one formula; model/long_attention.py: the kinds for long texts), the
classifier around it (model/classifier.py), its one configuration (model/config.py), which also rebuilds it from a checkpoint's
settings (a checkpoint is read safely by data/checkpoint.py)."""

from model.attention import AttentionWeights, MultiHeadSelfAttention
from model.classifier import AttentionClassifier, ClassifierOutput
from model.config import ConfigError, NetworkConfig

__all__ = [
    "AttentionClassifier", "AttentionWeights", "ClassifierOutput", "ConfigError", "MultiHeadSelfAttention",
    "NetworkConfig",
]
