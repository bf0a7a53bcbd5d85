"""bench/speed.py runs end to end and ends with its JSON summary.

No timing is asserted: speed is printed, not tested."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_speed_bench_smoke_run_ends_with_json_ratios():
    result = subprocess.run(
        [sys.executable, "bench/speed.py", "--smoke", "--device", "cpu", "--threads", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    for key in ("train_speed_ratio", "inference_speed_ratio", "train_memory_ratio", "inference_memory_ratio",
                "attention_fused_vs_sdpa_L8", "attention_explicit_vs_sdpa_L16"):
        assert summary[key] > 0, key
    assert summary["train_samples_per_s"]["ours"] > 0 and summary["train_samples_per_s"]["peer"] > 0
    assert "Classifier" in result.stdout and "Attention alone" in result.stdout
