"""Measurements: speed and accuracy against peers, long texts, explanations, the monitor's cost.

Run from the repository root as modules: `python -m bench.timing speed --quick` (see bench/README.md).
"""

import model.threads  # noqa: F401  (every bench's thread pool, set before any bench loads torch: model/threads.py)
