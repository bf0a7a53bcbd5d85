"""The attention doctor's verdicts a checkpoint carries, for the explanation page's badges (inference/report.py).

The AttentionMonitor (monitor/callback.py) records one entry per validation epoch in its callback state, {"step",
"epoch", "findings": [Finding.to_dict()]}, and the checkpoint keeps it. The page shows the latest entry: each finding
as plain JSON, {"verdict", "severity", "layer", "head", "figures", "detail", "cause", "fix"} (layer None: the whole
model; head None: the whole layer; severity, cause and fix from monitor/doctor.py's VERDICTS), and draws a badge per head from
the findings of that head and of its layer. A checkpoint with no monitor history (trained without the monitor, or
written by hand) gives None: the page says "not examined".
"""

import math

from data.checkpoint import read_checkpoint
from monitor.doctor import VERDICTS, Finding

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
    """One stored finding (monitor/doctor.py's Finding.to_dict) as the page reads it: with its severity, likely cause
    and fix from the verdict table, figures that are not finite as None (JSON has no NaN); None when it is not a
    finding. A verdict this version does not know is shown as a note."""
    try:
        found = Finding.from_dict(finding)
        figures = {str(name): float(value) for name, value in found.figures.items()}
    except (KeyError, TypeError, ValueError):
        return None
    if not isinstance(found.verdict, str) or not all(w is None or type(w) is int for w in (found.layer, found.head)):
        return None
    verdict = VERDICTS.get(found.verdict)
    figures = {name: value if math.isfinite(value) else None for name, value in figures.items()}
    return {"verdict": found.verdict, "severity": verdict.severity if verdict else "note", "layer": found.layer,
            "head": found.head, "figures": figures, "detail": found.detail,
            "cause": verdict.cause if verdict else "a verdict this version of the doctor does not know",
            "fix": verdict.fix if verdict else ""}


def stored_verdicts(path) -> dict | None:
    """latest_verdicts of a checkpoint file (read safely, data/checkpoint.py)."""
    return latest_verdicts(read_checkpoint(path))
