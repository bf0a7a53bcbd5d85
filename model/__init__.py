"""The network, plain PyTorch (no Lightning, no data, no matplotlib): the hand-written attention
(model/attention.py: `attention()`, the one formula; model/long_attention.py: the kinds for long texts), the
classifier around it (model/classifier.py), its one configuration (model/config.py), which also rebuilds it from a checkpoint's
settings (a checkpoint is read safely by data/checkpoint.py).

The names below load torch on first use, so that `import runtime` (a command's thread pool setting, which must come
before torch is loaded) loads nothing heavy.
"""

__all__ = [
    "AttentionClassifier", "AttentionWeights", "ClassifierOutput", "ConfigError", "MultiHeadSelfAttention",
    "NetworkConfig",
]
_HOMES = {"AttentionWeights": "model.attention", "MultiHeadSelfAttention": "model.attention",
          "AttentionClassifier": "model.classifier", "ClassifierOutput": "model.classifier",
          "ConfigError": "model.config", "NetworkConfig": "model.config"}


def __getattr__(name):
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(_HOMES[name]), name)
    raise AttributeError(f"module 'model' has no attribute {name!r}")
