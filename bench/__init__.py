"""Measurements: speed and accuracy against peers, long texts, explanations, the monitor's cost.

Run from the repository root as modules: `python -m bench.timing speed --quick` (see bench/README.md).
"""

import runtime

# Every bench is a command (`python -m bench.NAME`), whose process is tuned before its module loads torch: the package
# is the one place all of them pass through first (runtime.py).
runtime.configure()
