"""The benches measure what they say: bench/speed.py's tools give known answers (peak memory of known tensors,
the alternating order, the SST-2 length histogram, padded batches) and its summary is built from the figures it
reports; bench/predict_speed.py runs; bench/ensemble.py scores checkpoints on the split train.py validated on.

No timing is asserted: speed is printed, not tested."""

import csv
import importlib.util
import json
import math
import os
import random
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import train
from data.tokenizer import PAD_ID, UNK_ID
from model.config import ConfigError, NetworkConfig

ROOT = Path(__file__).resolve().parent.parent


def load_script(name: str):
    """A bench script as a module (bench/ is a folder of scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


speed = load_script("speed")


def test_peak_memory_counts_the_tensors_alive_at_once():
    def two_then_one():
        a, b = torch.ones(2**20), torch.ones(2**20)  # 4 MiB each, alive together
        del a, b
        torch.ones(2**19)  # 2 MiB, after both are freed

    def three_in_turn():
        for _ in range(3):
            torch.ones(2**20)  # each freed before the next

    assert speed.peak_memory(two_then_one, torch.device("cpu")) == 8 * 2**20
    assert speed.peak_memory(three_in_turn, torch.device("cpu")) == 4 * 2**20


def test_alternate_calls_in_turn_and_reports_each_runs_median():
    calls = []

    def run(name, seconds):
        calls.append(name)
        time.sleep(seconds)

    medians = speed.alternate({"a": lambda: run("a", 0.05), "b": lambda: run("b", 0.0)}, warmup=1, repeats=3,
                              device=torch.device("cpu"))
    assert calls == ["a", "b"] * 4  # one warm-up round, then three timed rounds, A B A B …
    assert medians["a"] >= 0.05 > medians["b"]  # sleep never returns early; no upper bound on a busy machine


def test_sst2_lengths_follow_the_sst2_histogram():
    counts = speed.SST2_LENGTH_COUNTS
    assert sum(counts) == 67_349 and len(counts) == 52  # every SST-2 train sentence, 1 to 52 tokens
    lengths = speed.sst2_lengths(np.random.default_rng(0), 200_000)
    assert lengths.min() >= 1 and lengths.max() <= 52
    assert np.median(lengths) == 7 and np.percentile(lengths, 90) == 21  # the histogram's median and p90


def test_make_batch_pads_to_the_longest_and_marks_exactly_the_padding():
    token_ids, mask, labels = speed.make_batch([3, 1, 2], 50, 2, torch.Generator().manual_seed(0), "cpu")
    expected = torch.tensor([[False, False, False], [False, True, True], [False, False, True]])
    assert torch.equal(mask, expected)
    assert torch.equal(token_ids == PAD_ID, expected)
    assert bool((token_ids[~expected] > UNK_ID).all()) and int(token_ids.max()) < 50
    assert labels.shape == (3,)
    assert speed.make_batch([4, 4], 50, 2, torch.Generator(), "cpu", pad=False)[1] is None


def test_network_is_read_from_the_config_like_train_py(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"data": {"vocab_size": 50}, "model": {"network": {"d_model": 24, "n_heads": 3},
                                                                             "lr": 0.1}}))
    assert speed.load_network(config) == NetworkConfig(vocab_size=50, d_model=24, n_heads=3)
    config.write_text(yaml.safe_dump({"model": {"network": {"d_modle": 24}}}))
    with pytest.raises(ConfigError, match="d_modle"):
        speed.load_network(config)


def test_both_kernels_run_the_same_network_and_only_the_kernel_differs():
    models = speed.build_models(speed.SMOKE_NETWORK, torch.device("cpu"))
    assert models["manual"].config.attention_kernel == "manual" and models["fused"].config.attention_kernel == "fused"
    token_ids, mask, _ = speed.make_batch([5, 2, 3], 100, 2, torch.Generator().manual_seed(0), "cpu")
    logits = {side: models[side].eval()(token_ids, mask).logits for side in ("manual", "fused")}
    torch.testing.assert_close(logits["manual"], logits["fused"])


def run_bench(*args) -> tuple[str, dict]:
    result = subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            check=True)
    return result.stdout, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_speed_bench_smoke_summary_holds_every_figure_and_ratios_are_its_throughputs_divided():
    stdout, summary = run_bench("bench/speed.py", "--smoke", "--device", "cpu", "--threads", "1")
    assert "Classifier" in stdout and "Attention layer alone" in stdout
    for workload in ("sst2", "L8", "L16"):  # the smoke plan: SST-2 lengths, then fixed lengths 8 and 16
        for task in ("train", "infer"):
            per_s = summary[f"{task}_per_s_{workload}"]
            assert set(per_s) == {"manual", "fused", "peer"}
            assert all(math.isfinite(v) and v > 0 for v in per_s.values()), (task, workload, per_s)
            for kernel in ("manual", "fused"):
                ratio = summary[f"{kernel}_{task}_ratio_{workload}"]
                assert ratio == pytest.approx(per_s[kernel] / per_s["peer"], rel=1e-12), (kernel, task, workload)
                memory = summary[f"{kernel}_{task}_memory_ratio_{workload}"]
                assert math.isfinite(memory) and memory > 0
    for L in (8, 16):
        for path in ("manual", "fused", "weights"):
            value = summary[f"attention_{path}_vs_sdpa_L{L}"]
            assert math.isfinite(value) and value > 0
    assert summary["threads"] == 1 and summary["device"] == "cpu"
    assert NetworkConfig.from_dict(summary["network"]).d_model == speed.SMOKE_NETWORK.d_model


@pytest.mark.slow
def test_predict_speed_smoke_run_reports_every_figure():
    stdout, figures = run_bench("bench/predict_speed.py", "--smoke", "--threads", "1")
    assert figures["texts"] == 872  # the SST-2 validation set, or as many synthetic sentences without it
    assert figures["batch_size"] == 256 and figures["torch_threads"] == 1
    for key in ("sentences_per_s", "single_text_latency_ms", "predict_py_startup_s"):
        assert math.isfinite(figures[key]) and figures[key] > 0, key
    assert "batch inference" in stdout


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
    config, best, _ = smoke_run
    # The same checkpoint twice: its average is itself, and the texts wrong in every one are exactly its errors.
    result = ensemble("--config", config, best, best, "--nb-lr")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    # The best checkpoint's file name carries the val/acc train.py measured; the script must find the same.
    logged = float(re.search(r"acc(\d\.\d{4})", best.name).group(1))
    assert summary["accuracy"][str(best)] == pytest.approx(logged, abs=6e-5)
    n = summary["validation_texts"]
    assert n == 60  # 10% of 600
    assert summary["accuracy"]["average of 2"] == summary["accuracy"][str(best)]
    errors = round((1 - summary["accuracy"][str(best)]) * n)
    assert summary["wrong_in_every_checkpoint"] == summary["wrong_in_at_least_half"] == errors
    assert summary["right_in_every_checkpoint"] == n - errors
    assert {"NB-LR", "average of 2, then averaged with NB-LR"} <= set(summary["accuracy"])


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


def test_fit_and_test_script_reports_time_memory_and_the_best_checkpoint(tmp_path):
    result = subprocess.run(["bash", str(ROOT / "bench" / "fit_and_test.sh"), str(tmp_path / "run"), "--config",
                             str(ROOT / "configs" / "smoke.yaml"), "--trainer.max_epochs", "1",
                             "--data.cache_dir", str(tmp_path / "cache")],
                            capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    fit_seconds = int(re.search(r"FIT_SECONDS (\d+)", result.stdout).group(1))
    peak = int(re.search(r"PEAK_RSS_MIB (\d+)", result.stdout).group(1))
    best = Path(re.search(r"BEST (\S+)", result.stdout).group(1))
    assert fit_seconds >= 1 and peak > 100  # a Python process with torch holds far more than 100 MiB
    assert best.is_file() and best.parent.parent.parent.parent == tmp_path / "run"
    # The synthetic task has no labelled test split: the scoring step says so in one line.
    assert "error: no test split" in result.stdout
