"""The attention doctor's verdicts a checkpoint carries, for the explanation page's badges (inference/report.py).

The AttentionMonitor records one entry per validation epoch in its callback state, {"step", "epoch", "findings":
[finding dicts]}, and the checkpoint keeps it. The page shows the latest entry: each finding as plain JSON,
{"verdict", "severity", "layer", "head", "figures", "cause", "fix"} (layer None: the whole model; head None: the
whole layer), and draws a badge per head from the findings of that head and of its layer. A checkpoint with no
monitor history (trained without the monitor, or written by hand) gives None: the page says "not examined".
"""

import math

from data.checkpoint import read_checkpoint

MONITOR = "AttentionMonitor"  # Lightning keys a callback's state by its class name (and its settings)


def monitor_history(checkpoint: dict) -> list:
    """The monitor's history list in a checkpoint, [] when it holds none."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if MONITOR in str(key) and isinstance(state, dict) and isinstance(state.get("history"), list):
            return state["history"]
    return []


def latest_verdicts(checkpoint: dict) -> dict | None:
    """{"epoch", "step", "findings": [plain finding dicts]} of the monitor's last validation, or None when the
    checkpoint holds none (or holds something else under that name)."""
    history = monitor_history(checkpoint)
    entry = history[-1] if history else None
    if not isinstance(entry, dict) or not isinstance(entry.get("findings"), list):
        return None
    findings = [plain(finding) for finding in entry["findings"]]
    if None in findings:
        return None
    return {"epoch": entry.get("epoch"), "step": entry.get("step"), "findings": findings}


def plain(finding) -> dict | None:
    """One stored finding as the page reads it (figures that are not finite become None: JSON has no NaN), or None
    when it is not a finding."""
    if not isinstance(finding, dict) or not isinstance(finding.get("verdict"), str):
        return None
    where = [finding.get("layer"), finding.get("head")]
    if not all(w is None or isinstance(w, int) for w in where) or not isinstance(finding.get("figures", {}), dict):
        return None
    figures = {str(name): float(value) if math.isfinite(float(value)) else None
               for name, value in finding.get("figures", {}).items() if isinstance(value, (int, float))}
    return {"verdict": finding["verdict"], "severity": finding.get("severity", "note"), "layer": where[0],
            "head": where[1], "figures": figures, "cause": finding.get("cause", ""), "fix": finding.get("fix", "")}


def stored_verdicts(path) -> dict | None:
    """latest_verdicts of a checkpoint file (read safely, data/checkpoint.py)."""
    return latest_verdicts(read_checkpoint(path))
