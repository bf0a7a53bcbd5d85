"""The attention monitor: health figures and verdicts (health.py), heatmap images (heatmap.py) over the token ×
token views of any kind (views.py), and the Lightning callback that logs both to TensorBoard while a model trains
(callback.py).

`monitor.health`, `monitor.heatmap` and `monitor.views` import no Lightning and no data module; only the callback
does, so `from monitor import AttentionMonitor` (what configs name as `monitor.AttentionMonitor`) loads it on first
use.

`assert_attention_contract(MyAttention(64, 4))` (monitor/layer_contract.py) is for a user's own tests: the
attention contract on one layer, an AssertionError with its table when a check FAILs.
"""

__all__ = ["AttentionMonitor", "assert_attention_contract", "layer_contract"]


def __getattr__(name):
    if name == "AttentionMonitor":  # imported on first use: it pulls in Lightning and the data module
        from monitor.callback import AttentionMonitor

        return AttentionMonitor
    if name in ("assert_attention_contract", "layer_contract"):
        import monitor.layer_contract

        return getattr(monitor.layer_contract, name)
    raise AttributeError(f"module 'monitor' has no attribute {name!r}")
