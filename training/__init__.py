"""The training system: the LightningModule around the network (loss, metrics, optimizer, schedule)."""

from training.module import ClassifierModule

__all__ = ["ClassifierModule"]
