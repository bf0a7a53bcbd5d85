"""The benches measure what they say: bench/speed.py's tools give known answers (peak memory of known tensors,
the alternating order, the SST-2 length histogram, padded batches) and its summary is built from the figures it
reports; bench/predict_speed.py runs; bench/ensemble.py scores checkpoints on the split train.py validated on;
bench/common.py reads a config's network; a run's best checkpoint is picked by the score recorded inside it; a bad
bench flag is one line before anything runs.

No timing is asserted: speed is printed, not tested."""

import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from bench import ensemble, speed
from bench.common import network_config
from conftest import ONE_PROBE, ROOT, SMOKE, save_checkpoint, tiny_classifier
from data.checkpoint import CheckpointError, best_checkpoint
from data.tokenizer import PAD_ID, UNK_ID
from model.config import ConfigError, NetworkConfig


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
    assert network_config(config) == NetworkConfig(vocab_size=50, d_model=24, n_heads=3)
    config.write_text(yaml.safe_dump({"model": {"network": {"d_modle": 24}}}))
    with pytest.raises(ConfigError, match="d_modle"):
        network_config(config)


def test_both_kernels_run_the_same_network_and_only_the_kernel_differs():
    models = speed.build_models(speed.SMOKE_NETWORK, torch.device("cpu"))
    assert models["manual"].config.attention_kernel == "manual" and models["fused"].config.attention_kernel == "fused"
    token_ids, mask, _ = speed.make_batch([5, 2, 3], 100, 2, torch.Generator().manual_seed(0), "cpu")
    logits = {side: models[side].eval()(token_ids, mask).logits for side in ("manual", "fused")}
    torch.testing.assert_close(logits["manual"], logits["fused"])


def run_bench(target, *args) -> tuple[str, dict]:
    """The timing harness in its own process: the table (stderr) and the JSON figures (the last line of stdout)."""
    result = subprocess.run([sys.executable, "-m", "bench.timing", target, *map(str, args)], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, check=True)
    return result.stderr, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_speed_bench_smoke_summary_holds_every_figure_and_ratios_are_its_throughputs_divided():
    table, summary = run_bench("speed", "--smoke", "--device", "cpu", "--threads", "1")
    assert "Classifier" in table and "Attention layer alone" in table
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
    table, figures = run_bench("predict", "--smoke", "--threads", "1")
    assert figures["texts"] == 872  # the SST-2 validation set, or as many synthetic sentences without it
    assert figures["batch_size"] == 256 and figures["threads"] == 1 and figures["target"] == "predict"
    for key in ("sentences_per_s", "single_text_latency_ms", "predict_py_startup_s"):
        assert math.isfinite(figures[key]) and figures[key] > 0, key
    assert "batch inference" in table
    # The machine's load when the figures were printed: the kernel updates it every 5 s, by at most ~8% of the gap
    # to the run queue's length, so the value read just after the process ended is that close.
    after = os.getloadavg()[0]
    assert abs(figures["load_average_1min"] - after) <= 1 + 0.1 * after


def run_ensemble(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench.ensemble", *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def ensemble_summary(capsys, *args) -> dict:
    ensemble.main([str(arg) for arg in args])
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.slow
def test_ensemble_scores_checkpoints_on_the_split_train_py_validated_on(smoke_run, capsys):
    best = smoke_run.best
    # The same checkpoint twice: its average is itself, and the texts wrong in every one are exactly its errors.
    summary = ensemble_summary(capsys, "--config", smoke_run.run / "config.yaml", best, best)
    # The best checkpoint's file name carries the val/acc train.py measured; the script must find the same.
    logged = float(re.search(r"acc(\d\.\d{4})", best.name).group(1))
    assert summary["accuracy"][str(best)] == pytest.approx(logged, abs=6e-5)
    n = summary["validation_texts"]
    assert n == len(smoke_run.cli.datamodule.split("validation").lengths)  # the split train.py validated on
    assert summary["accuracy"]["average of 2"] == summary["accuracy"][str(best)]
    errors = round((1 - summary["accuracy"][str(best)]) * n)
    assert summary["wrong_in_every_checkpoint"] == summary["wrong_in_at_least_half"] == errors
    assert summary["right_in_every_checkpoint"] == n - errors


@pytest.mark.slow
def test_ensemble_averages_with_nb_lr_on_two_classes(tmp_path, capsys):
    classifier = tiny_classifier()
    classifier.label_names = ["0", "1"]  # the synthetic dataset's label names
    ckpt = save_checkpoint(classifier, tmp_path / "tiny.ckpt")
    config = tmp_path / "synthetic.yaml"
    config.write_text(yaml.safe_dump({"data": {"dataset": "synthetic"}}))
    summary = ensemble_summary(capsys, "--config", config, ckpt, "--nb-lr")
    accuracy = summary["accuracy"]
    assert set(accuracy) == {str(ckpt), "average of 1", "NB-LR", "average of 1, then averaged with NB-LR"}
    assert accuracy["average of 1"] == accuracy[str(ckpt)] and all(0 <= a <= 1 for a in accuracy.values())


def ensemble_refusal(capfd, *args) -> str:
    """bench.ensemble.main's exit in this process: the one line a real process prints (the missing checkpoint below
    shows in a real process that this line is all of stderr), and no traceback."""
    with pytest.raises(SystemExit) as stop:
        ensemble.main([str(arg) for arg in args])
    line = str(stop.value.code)
    assert line.startswith("error:") and "\n" not in line
    assert "Traceback" not in capfd.readouterr().err
    return line


def test_ensemble_refuses_a_checkpoint_with_other_labels(smoke_run, tmp_path, capfd):
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"data": {"dataset": "synthetic"}}))  # labels 0/1, not "alpha first"/...
    assert str(smoke_run.best) in ensemble_refusal(capfd, "--config", other, smoke_run.best)


@pytest.mark.slow  # a fresh Python process
def test_fit_and_test_script_reports_time_memory_and_the_best_checkpoint(tmp_path):
    result = subprocess.run(["bash", str(ROOT / "bench" / "fit_and_test.sh"), str(tmp_path / "run"), "--config",
                             SMOKE, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "4",
                             "--trainer.limit_val_batches", "2", "--data.cache_dir", str(tmp_path / "cache"),
                             *ONE_PROBE],
                            capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    fit_seconds = int(re.search(r"FIT_SECONDS (\d+)", result.stdout).group(1))
    peak = int(re.search(r"PEAK_RSS_MIB (\d+)", result.stdout).group(1))
    best = Path(re.search(r"BEST (\S+)", result.stdout).group(1))
    assert fit_seconds >= 1 and peak > 100  # a Python process with torch holds far more than 100 MiB
    assert best.is_file() and best.parent.parent.parent.parent == tmp_path / "run"
    assert best == best_checkpoint(best.parent)
    # The synthetic task has no labelled test split: the scoring step says so in one line.
    assert "error: no test split" in result.stdout


# --- the best checkpoint of a run (data/checkpoint.py best_checkpoint: predict.py --ckpt RUN, the benches) --------


def scored_checkpoint(folder: Path, name: str, score: float | None, step: int, mode: str = "max",
                      monitor: str = "val/acc", best: str | None = None) -> Path:
    """A checkpoint holding what Lightning's ModelCheckpoint records: its settings in the state key, and the score
    of every file it kept (best_k_models). score None: a file the callback did not record (as last.ckpt)."""
    folder.mkdir(parents=True, exist_ok=True)
    key = (f"ModelCheckpoint{{'monitor': {monitor!r}, 'mode': {mode!r}, 'every_n_train_steps': 0, "
           "'every_n_epochs': 1, 'train_time_interval': None}")
    kept = {} if score is None else {str(folder / name): torch.tensor(score)}
    if best is not None:
        kept[str(folder / best)] = torch.tensor(0.5)
    torch.save({"state_dict": {}, "hyper_parameters": {"network": {}, "label_names": ["a", "b"]}, "global_step": step,
                "TextDataModule": {"tokenizer": "{}"},
                "callbacks": {key: {"monitor": monitor, "best_k_models": kept}}}, folder / name)
    return folder / name


def test_best_checkpoint_is_chosen_by_the_recorded_score_not_by_name_or_date(tmp_path):
    epoch9 = scored_checkpoint(tmp_path, "best-epoch9-step90.ckpt", 0.80, step=90)
    epoch10 = scored_checkpoint(tmp_path, "best-epoch10-step100.ckpt", 0.85, step=100)
    scored_checkpoint(tmp_path, "last.ckpt", None, step=120, best=epoch10.name)  # records another file's score
    os.utime(epoch9, (2e9, 2e9))  # the newest file on disk, and the last in name order
    assert sorted(p.name for p in tmp_path.glob("best-*"))[-1] == epoch9.name
    assert best_checkpoint(tmp_path) == epoch10
    scored_checkpoint(tmp_path, epoch9.name, 0.90, step=90)  # now epoch 9 scored best
    assert best_checkpoint(tmp_path) == epoch9
    scored_checkpoint(tmp_path, epoch10.name, 0.90, step=100)  # a tie: the later step
    assert best_checkpoint(tmp_path) == epoch10


def test_best_checkpoint_of_a_lower_is_better_metric_and_of_a_run_folder(tmp_path):
    folder = tmp_path / "lightning_logs" / "version_0"
    low = scored_checkpoint(folder / "checkpoints", "best-epoch10-loss0.20.ckpt", 0.20, step=100, mode="min",
                            monitor="val/loss")
    scored_checkpoint(folder / "checkpoints", "best-epoch9-loss0.30.ckpt", 0.30, step=90, mode="min",
                      monitor="val/loss")
    assert best_checkpoint(folder) == best_checkpoint(folder / "checkpoints") == low


def test_without_a_recorded_score_last_ckpt_else_a_one_line_error(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint with a recorded validation score and no last.ckpt"):
        best_checkpoint(tmp_path)
    last = scored_checkpoint(tmp_path, "last.ckpt", None, step=10)
    assert best_checkpoint(tmp_path) == last


def test_best_checkpoint_of_a_real_run_is_the_one_train_py_named_best(smoke_run):
    assert best_checkpoint(smoke_run.run) == smoke_run.best


def test_the_roofline_benchs_busy_programs_stop_when_it_is_interrupted():
    from bench.machine import busy_programs

    with pytest.raises(KeyboardInterrupt), busy_programs(2) as programs:
        assert [p.poll() for p in programs] == [None, None]  # running
        raise KeyboardInterrupt
    assert all(p.poll() is not None for p in programs)


@pytest.mark.slow
def test_the_roofline_bench_splits_a_step_and_runs_beside_busy_programs():
    result = subprocess.run([sys.executable, "-m", "bench.roofline", "--smoke"], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    figures = json.loads(result.stdout.splitlines()[-1])
    parts = figures["quiet_ms_per_step"]
    assert set(parts) == {"data", "forward", "logging", "backward", "optimizer", "monitor", "rest"}
    assert math.isclose(sum(parts.values()), figures["step_ms"], rel_tol=1e-3)  # the parts are the whole step
    assert figures["floor_ms_per_step"]["backward"] > figures["floor_ms_per_step"]["forward"] > 0  # FLOPs counted
    assert set(figures["phases"]) == {"quiet", "1 busy", "2 busy"} and figures["matmul_gflops"] > 0
    assert figures["inference_tokens_per_s"] > 0 and figures["make_train_estimate"]["seconds"]["quiet"] > 0
    assert "torch threads" in result.stderr  # the thread setting, logged
    from bench.machine import BUSY_LOOP

    def command_line(path: Path) -> bytes:
        try:
            return path.read_bytes()
        except OSError:  # the process ended meanwhile
            return b""

    def busy_loops() -> list[Path]:
        return [path for path in Path("/proc").glob("[0-9]*/cmdline") if BUSY_LOOP.encode() in command_line(path)]

    time.sleep(0.5)
    assert busy_loops() == [], "busy programs left running"


@pytest.mark.parametrize("bench, args, said", [
    ("scale", ["sizes", "--texts", "0"], "--texts: must be >= 1, got 0"),
    ("healthy", ["--dry-run", "--jobs", "0"], "--jobs: must be >= 1, got 0"),
    ("healthy", ["--dry-run", "--configs", "nope.yaml"], "--configs nope.yaml: not a shipped classifier config"),
    ("diagnosis", ["--quick", "--rows", "-5"], "--rows: must be >= 1, got -5"),
    ("diagnosis", ["--quick", "--out", "."], "is a directory"),
])
def test_a_bad_bench_flag_is_one_line_before_anything_runs(bench, args, said, capsys, monkeypatch):
    import importlib

    proof = importlib.import_module("bench.catalogue.proof")
    module = importlib.import_module(f"bench.{bench}")
    monkeypatch.setattr(proof, "fit", lambda *a, **k: pytest.fail("a run started"))
    with pytest.raises(SystemExit) as stop:
        module.main(args)
    message = stop.value.code if isinstance(stop.value.code, str) else capsys.readouterr().err.strip()
    assert stop.value.code not in (0, None) and said in message and len(message.splitlines()) == 1, message
