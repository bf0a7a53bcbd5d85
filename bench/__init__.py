"""Measurements: speed and accuracy against peers, long texts, explanations, the monitor's cost.

Run from the repository root as modules: `python -m bench.timing speed --quick` (see bench/README.md).
"""
