"""Predictions from a checkpoint, without Lightning: `TextClassifier.from_checkpoint(path).predict(texts)` (finding
and reading checkpoints, and their CheckpointError: data/checkpoint.py).

The names below load torch on first use, so the faces can import inference.limits and inference.texts (which load
nothing heavy) to answer `--help` and argument errors at once.
"""

__all__ = ["TextClassifier", "Prediction"]


def __getattr__(name: str):
    if name in __all__:
        from inference import classifier

        return getattr(classifier, name)
    raise AttributeError(f"module 'inference' has no attribute {name!r}")
