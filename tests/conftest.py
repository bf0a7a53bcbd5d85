"""What the test modules share: paths, the smoke config, quiet trainer flags, and ONE smoke run per session.

`smoke_run` (session-scoped) trains configs/smoke.yaml once, on a small CSV of three string-named classes (which
of two markers comes first, or neither: `LABELS`), so a class index can never pass for a label name. Its
AttentionMonitor draws one validation probe and `PROBE_TEXT`. Everything it wrote is shared by every test that
asks for it: read it, never change it (copy a checkpoint into tmp_path first).

Constants and helpers are imported as `from conftest import ROOT, SMOKE, QUIET, ONE_PROBE, refuses_causal`.
"""

import csv
import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

# One intra-op thread in this process and in every process a test starts (they inherit the variable; it must be set
# before torch is imported): pytest-xdist already keeps both cores busy, and on a busy core OpenMP's spinning threads
# made the smoke run 4x slower. A value set by the caller is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
# smoke.yaml's AttentionMonitor draws 4 probe heatmaps at every validation end, half of a short fit's time. A fit whose
# claim is not about the probes keeps the monitor (its health figures and verdicts, a probe figure) with one probe.
ONE_PROBE = ["--trainer.callbacks",
             json.dumps([{"class_path": "monitor.AttentionMonitor", "init_args": {"num_probes": 1}}])]
LABELS = ["alpha first", "beta first", "no marker"]  # names, so a class index can never pass for a label
TEXTS = ["w1 alpha w2 beta w3", "beta w4 alpha", "w5 w6 w7", "alpha beta w8 w9 w10 w11 w12 w13 w14 w15 w16"]
PROBE_TEXT = "beta w3 w7 alpha w5"  # words of the marker vocabulary
SMOKE_EPOCHS = 4  # validation accuracy about 0.93: the order of the markers is learned (only attention sees it)
SMOKE_ROWS = 4000  # 3,600 training and 400 validation texts, as many as the synthetic dataset of smoke.yaml


def refuses_causal(kind: str) -> bool:
    """True when the attention kind refuses the look-ahead mask (its own rule, model/kinds.py)."""
    from model.config import ConfigError, NetworkConfig

    try:
        NetworkConfig(attention=kind, causal=True)
    except ConfigError:
        return True
    return False


def marker_rows(n: int, seed: int = 0, labels=LABELS) -> list[tuple[str, str]]:
    """Which of two markers comes first, or neither (when `labels` has a third name), among filler words. Thirty
    filler words, so the tokenizer fills the smoke config's 64-entry vocabulary."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = [f"w{rng.randrange(30)}" for _ in range(rng.randint(4, 10))]
        kind = rng.randrange(len(labels))
        if kind < 2:
            first, second = ("alpha", "beta") if kind == 0 else ("beta", "alpha")
            i, j = sorted(rng.sample(range(len(words) + 2), 2))
            words.insert(i, first)
            words.insert(j, second)
        rows.append((" ".join(words), labels[kind]))
    return rows


def write_csv(path: Path, rows) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "label"), *rows])
    return path


def monitor_overlay(path: Path, **init_args) -> Path:
    """A config overlay whose trainer.callbacks replaces smoke.yaml's with one configured AttentionMonitor."""
    path.write_text(yaml.safe_dump({"trainer": {"callbacks": [
        {"class_path": "monitor.AttentionMonitor", "init_args": init_args}]}}))
    return path


@dataclass(frozen=True)
class SmokeRun:
    root: Path  # --trainer.logger.init_args.save_dir; also holds the CSV and the data cache
    run: Path  # lightning_logs/version_0: config.yaml, TensorBoard events, checkpoints/
    best: Path  # checkpoints/best-*.ckpt (train.py keeps one)
    last: Path  # checkpoints/last.ckpt
    train_file: Path
    cli: object  # the LightningCLI of the fit: its trainer, model and datamodule, in memory


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> SmokeRun:
    import train

    root = tmp_path_factory.mktemp("smoke_run")
    train_file = write_csv(root / "markers.csv", marker_rows(SMOKE_ROWS))
    overlay = monitor_overlay(root / "monitor.yaml", num_probes=1, probe_texts=[PROBE_TEXT])
    cli = train.main([
        "fit", "--config", SMOKE, "--config", str(overlay), "--data.train_file", str(train_file),
        "--data.cache_dir", str(root / "cache"), "--trainer.logger.init_args.save_dir", str(root),
        "--trainer.max_epochs", str(SMOKE_EPOCHS), *QUIET,
    ])
    run = root / "lightning_logs" / "version_0"
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    return SmokeRun(root, run, best, run / "checkpoints" / "last.ckpt", train_file, cli)


# The modules that take longest (`--durations=0`), run first: pytest-xdist hands whole modules to the workers in
# collection order (`--dist loadfile --no-loadscope-reorder`, pyproject.toml), so the long ones start early and the
# many short ones even out the end. Only the order changes; a module missing here just runs later.
LONGEST_FIRST = ["test_export.py", "test_training.py", "test_bench.py", "test_bad_training.py", "test_predict.py",
                 "test_bad_inputs_round2.py", "test_pretraining.py", "test_adaptive.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order otherwise
