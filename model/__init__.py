"""The network: hand-written attention (model/attention.py), the classifier around it, and its Lightning wrapper."""

from model.attention import MultiHeadSelfAttention
from model.classifier import AttentionClassifier

__all__ = ["MultiHeadSelfAttention", "AttentionClassifier"]
