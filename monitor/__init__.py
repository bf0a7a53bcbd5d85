"""The attention monitor: health figures and verdicts (health.py), heatmap images (heatmap.py) and the Lightning
callback that logs both to TensorBoard while a model trains (callback.py)."""

from monitor.callback import AttentionMonitor

__all__ = ["AttentionMonitor"]
