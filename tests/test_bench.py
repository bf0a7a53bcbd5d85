"""bench/speed.py runs end to end and ends with its JSON summary; bench/ensemble.py scores checkpoints on the
split train.py validated on.

No timing is asserted: speed is printed, not tested."""

import csv
import json
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import train

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


def two_marker_csv(path: Path, n: int = 600, seed: int = 0) -> Path:
    """Which of two markers comes first, among filler words: two classes with string names."""
    rng = random.Random(seed)
    rows = [("text", "label")]
    for _ in range(n):
        words = [f"w{rng.randrange(30)}" for _ in range(rng.randint(3, 8))]
        first, second = rng.sample(["alpha", "beta"], 2)
        i, j = sorted(rng.sample(range(len(words) + 2), 2))
        words.insert(i, first)
        words.insert(j, second)
        rows.append((" ".join(words), f"{first} first"))
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows(rows)
    return path


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """A short smoke run on a two-class CSV: its saved config.yaml and its best and last checkpoints."""
    tmp_path = tmp_path_factory.mktemp("ensemble")
    train_file = two_marker_csv(tmp_path / "markers.csv")
    train.main([
        "fit", "--config", str(ROOT / "configs" / "smoke.yaml"), "--data.train_file", str(train_file),
        "--data.cache_dir", str(tmp_path / "cache"), "--trainer.logger.init_args.save_dir", str(tmp_path),
        "--trainer.max_epochs", "3", "--trainer.enable_progress_bar", "false",
    ])
    run = tmp_path / "lightning_logs" / "version_0"
    best = next((run / "checkpoints").glob("best-*.ckpt"))
    return run / "config.yaml", best, run / "checkpoints" / "last.ckpt"


def ensemble(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/ensemble.py", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_ensemble_scores_checkpoints_on_the_split_train_py_validated_on(smoke_run):
    config, best, last = smoke_run
    result = ensemble("--config", config, best, last, "--nb-lr")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    # The best checkpoint's file name carries the val/acc train.py measured; the script must find the same.
    logged = float(re.search(r"acc(\d\.\d{4})", best.name).group(1))
    assert summary["accuracy"][str(best)] == pytest.approx(logged, abs=6e-5)
    n = summary["validation_texts"]
    assert n == 60  # 10% of 600
    errors = [round((1 - summary["accuracy"][str(p)]) * n) for p in (best, last)]
    assert summary["wrong_in_every_checkpoint"] <= min(errors)
    assert summary["right_in_every_checkpoint"] <= n - max(errors)
    assert 0 <= summary["accuracy"]["NB-LR"] <= 1 and "average of 2" in summary["accuracy"]


def test_ensemble_refuses_a_checkpoint_with_other_labels(smoke_run, tmp_path):
    _, best, _ = smoke_run
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"data": {"dataset": "synthetic"}}))  # labels 0/1, not "alpha first"/...
    result = ensemble("--config", other, best)
    assert result.returncode != 0
    assert result.stderr.strip().startswith("error:") and str(best) in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("missing", ["checkpoint", "config"])
def test_ensemble_missing_file_is_a_one_line_error(smoke_run, tmp_path, missing):
    config, best, _ = smoke_run
    if missing == "checkpoint":
        result = ensemble("--config", config, tmp_path / "nope.ckpt")
    else:
        result = ensemble("--config", tmp_path / "nope.yaml", best)
    assert result.returncode != 0 and "nope." in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
