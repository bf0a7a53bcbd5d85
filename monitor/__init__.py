"""The attention monitor: health figures and verdicts (health.py), heatmap images (heatmap.py) over the token ×
token views of any kind (views.py), and the Lightning callback that logs both to TensorBoard while a model trains
(callback.py).

`monitor.health`, `monitor.heatmap` and `monitor.views` import no Lightning and no data module; only the callback
does, so `from monitor import AttentionMonitor` (what configs name as `monitor.AttentionMonitor`) loads it on first
use.
"""

__all__ = ["AttentionMonitor"]


def __getattr__(name):
    if name == "AttentionMonitor":  # imported on first use: it pulls in Lightning and the data module
        from monitor.callback import AttentionMonitor

        return AttentionMonitor
    raise AttributeError(f"module 'monitor' has no attribute {name!r}")
