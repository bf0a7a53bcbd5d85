"""What the test modules share: paths, the smoke config, quiet trainer flags, and ONE smoke run per session.

`smoke_run` (session-scoped) trains configs/smoke.yaml once, on a small CSV of three string-named classes (which
of two markers comes first, or neither: `LABELS`), so a class index can never pass for a label name. Its
AttentionMonitor draws one validation probe and `PROBE_TEXT`. Everything it wrote is shared by every test that
asks for it: read it, never change it (copy a checkpoint into tmp_path first).

Constants and helpers are imported as `from conftest import ROOT, SMOKE, QUIET, ONE_PROBE, tiny_classifier`; no test
module imports another. `registered_kind` runs a test once per attention kind of the registry plus a tiny kind plugged
in with one registry line (tests/test_kinds.py), so a new kind is tested by the tests that exist.
"""

import contextlib
import csv
import hashlib
import json
import os
import random
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

# One intra-op thread in this process and in every process a test starts (they inherit the variable; it must be set
# before torch is imported): pytest-xdist already keeps both cores busy. A value set by the caller is kept; the
# rest of the setting comes from runtime.py, as in every command (this process is the test run's command).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import runtime  # noqa: E402

runtime.configure()  # after the thread count, before torch

import torch  # noqa: E402 (after the thread setting)
import torch.nn.functional as F  # noqa: E402

from data.tokenizer import stored_form, train_tokenizer  # noqa: E402
from inference import TextClassifier  # noqa: E402
from model.attention import MultiHeadSelfAttention  # noqa: E402
from model.classifier import AttentionClassifier  # noqa: E402
from model.config import ConfigError, NetworkConfig  # noqa: E402
from model.kinds import ATTENTION_KINDS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
SHORT = ["--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2"]  # for claims that need no learning
# smoke.yaml's AttentionMonitor draws 4 probe heatmaps at every validation end, half of a short fit's time. A fit whose
# claim is not about the probes keeps the monitor (its health figures and verdicts, a probe figure) with one probe.
ONE_PROBE = ["--trainer.callbacks",
             json.dumps([{"class_path": "monitor.AttentionMonitor", "init_args": {"num_probes": 1}}])]
LABELS = ["alpha first", "beta first", "no marker"]  # names, so a class index can never pass for a label
TEXTS = ["w1 alpha w2 beta w3", "beta w4 alpha", "w5 w6 w7", "alpha beta w8 w9 w10 w11 w12 w13 w14 w15 w16"]
# Words of the marker vocabulary, and prices: the smoke run draws them in its heatmap titles, as typed (a pair of
# dollar signs is no formula for matplotlib there).
PROBE_TEXT = "beta w3 paid $5 ^_^ w7 alpha worth $10 w5"
SMOKE_EPOCHS = 4  # validation accuracy about 0.93: the order of the markers is learned (only attention sees it)
SMOKE_ROWS = 4000  # 3,600 training and 400 validation texts, as many as the synthetic dataset of smoke.yaml


def refuses(kind: str, **settings) -> bool:
    """True when the attention kind refuses these settings, e.g. causal=True (its own rule, model/kinds.py)."""
    try:
        NetworkConfig(attention=kind, **settings)
    except ConfigError:
        return True
    return False


def refuses_causal(kind: str) -> bool:
    return refuses(kind, causal=True)


class SelfAndFirstAttention(MultiHeadSelfAttention):
    """Every query sees only itself and the first token: full attention with another mask. A kind plugged in the
    way a new module would be, to prove the registry-parametrized tests take a new kind (tests/test_kinds.py)."""

    def mask(self, key_padding_mask, L, device=None):
        seen = torch.eye(L, dtype=torch.bool, device=device)
        seen[:, 0] = True
        blocked = ~seen[None, None]  # (1, 1, L, L)
        if key_padding_mask is not None:
            blocked = blocked | key_padding_mask.bool()[:, None, None, :]  # (B, 1, L, L)
        return blocked

    def reference_keys(self, L, causal, device=None):  # its definition, for the doctor's formula check
        seen = torch.eye(L, dtype=torch.bool, device=device)
        seen[:, 0] = True
        return seen


PLUGGED_IN = "self_and_first"
KINDS = list(ATTENTION_KINDS)  # the shipped kinds
REGISTERED_KINDS = [*KINDS, PLUGGED_IN]  # and the plugged-in one


@contextlib.contextmanager
def registry_with_plugged_in():
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(ATTENTION_KINDS, PLUGGED_IN, SelfAndFirstAttention)  # the one line a new kind adds
        yield


@pytest.fixture(params=REGISTERED_KINDS)
def registered_kind(request):
    """Each kind of the registry, and the plugged-in one registered for the test."""
    with registry_with_plugged_in():
        yield request.param


WORDS = [f"w{i}" for i in range(20)] + ["alpha", "beta", "好", "差"]
SMALL = dict(window=2, global_tokens=1, projection_length=4)  # each kind reads the settings it takes
# The data settings a checkpoint of the synthetic task carries (what bench/ and the head tools read back).
SYNTHETIC = {"dataset": "synthetic", "data_dir": None, "train_file": None, "val_file": None, "test_file": None,
             "text_column": None, "label_column": None, "val_fraction": 0.1, "seed": 0}


def tiny_classifier(attention="full", pooling="mean", n_layers=2, seed=0, **overrides) -> TextClassifier:
    """A random 2-layer network (a TextClassifier) and a word tokenizer over WORDS: enough to check what a face or
    a method computes without training."""
    rng = random.Random(seed)
    texts = [" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(200)]
    tokenizer = train_tokenizer(texts, vocab_size=64, max_length=12, kind="word")
    torch.manual_seed(seed)
    config = NetworkConfig(vocab_size=64, num_classes=2, max_length=12, d_model=16, n_heads=2, n_layers=n_layers,
                           d_ff=32, dropout=0.0, embedding_dropout=0.0, pooling=pooling, attention=attention,
                           **(SMALL | overrides))
    return TextClassifier(AttentionClassifier(config), tokenizer, ["neg", "pos"], device="cpu")


def save_checkpoint(classifier: TextClassifier, path, data: dict | None = None):
    """A checkpoint in train.py's layout (weights, network, tokenizer, label names), written without training."""
    checkpoint = {
        "state_dict": {f"model.{k}": v for k, v in classifier.model.state_dict().items()},
        "hyper_parameters": {"network": classifier.model.config.to_dict(), "label_names": classifier.label_names},
        "TextDataModule": {"tokenizer": stored_form(classifier.tokenizer.to_str())},
    }
    if data is not None:
        checkpoint["datamodule_hyper_parameters"] = data
    torch.save(checkpoint, path)
    return path


def padding_mask(lengths, L: int):
    """(B, L) from the texts' lengths, True = padding."""
    return torch.arange(L)[None, :] >= torch.tensor(lengths)[:, None]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def error_line(stop: pytest.ExceptionInfo) -> str:
    """The message of a SystemExit: one line starting "error: "."""
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message
    return message


@pytest.fixture
def tiny_checkpoint(tmp_path) -> Path:
    """tmp_path/full.ckpt: tiny_classifier() over the synthetic task's labels, as train.py writes it."""
    import lightning

    classifier = tiny_classifier()
    classifier.label_names = ["0", "1"]
    path = save_checkpoint(classifier, tmp_path / "full.ckpt", data=SYNTHETIC)
    checkpoint = torch.load(path, weights_only=True)
    torch.save(checkpoint | {"pytorch-lightning_version": lightning.__version__}, path)
    return path


def fit(root: Path, *extra):
    """train.py fit on configs/smoke.yaml in-process, logging under `root`, one probe, no progress bar."""
    import train  # Lightning: loaded by the workers that train, not by pytest-xdist's controller

    return train.main(["fit", "--config", SMOKE, "--data.cache_dir", str(root / "cache"),
                       "--trainer.logger.init_args.save_dir", str(root), *QUIET, *ONE_PROBE, *extra])


POSITIVE = ["a great film", "wonderful and moving", "i loved it", "brilliant acting", "a joy to watch", "superb"]
NEGATIVE = ["a dull mess", "boring and slow", "i hated it", "terrible acting", "a waste of time", "awful"]


def rows(n=4):
    """Short English reviews, "pos" or "neg", each text n times."""
    return [(t, "pos") for t in POSITIVE * n] + [(t, "neg") for t in NEGATIVE * n]


def write(path, rows, fmt=None, text="text", label="label"):
    """(text, label) rows as a csv, tsv, jsonl, json or parquet file (from the suffix unless `fmt`)."""
    fmt = fmt or path.suffix.lstrip(".")
    if fmt in ("csv", "tsv"):
        sep = "," if fmt == "csv" else "\t"
        lines = [f"{text}{sep}{label}"] + [f"{t}{sep}{y}" for t, y in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif fmt == "jsonl":
        path.write_text("".join(json.dumps({text: t, label: y}) + "\n" for t, y in rows), encoding="utf-8")
    elif fmt == "json":
        path.write_text(json.dumps([{text: t, label: y} for t, y in rows]), encoding="utf-8")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({text: [t for t, _ in rows], label: [y for _, y in rows]}), path)
    return path


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
    fused_calls: int  # calls of torch's fused attention kernel during the fit


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory) -> SmokeRun:
    import train

    root = tmp_path_factory.mktemp("smoke_run")
    train_file = write_csv(root / "markers.csv", marker_rows(SMOKE_ROWS))
    overlay = monitor_overlay(root / "monitor.yaml", num_probes=1, probe_texts=[PROBE_TEXT])
    fused_calls = []
    fused = F.scaled_dot_product_attention
    with pytest.MonkeyPatch.context() as patch:
        # The callers are kept: the doctor's reference (monitor/reference.py dense_reference) calls torch's kernel on
        # purpose, as an implementation independent of the written lines; the model's own calls are counted.
        patch.setattr(F, "scaled_dot_product_attention",
                      lambda *a, **k: fused_calls.append(sys._getframe(1).f_code.co_name) or fused(*a, **k))
        cli = train.main([
            "fit", "--config", SMOKE, "--config", str(overlay), "--data.train_file", str(train_file),
            "--data.cache_dir", str(root / "cache"), "--trainer.logger.init_args.save_dir", str(root),
            "--trainer.max_epochs", str(SMOKE_EPOCHS), *QUIET,
        ])
    run = root / "lightning_logs" / "version_0"
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    model_calls = [caller for caller in fused_calls if caller != "dense_reference"]
    return SmokeRun(root, run, best, run / "checkpoints" / "last.ckpt", train_file, cli, len(model_calls))


# The modules that take longest (most CPU seconds), run first: pytest-xdist hands whole modules to the workers in
# collection order (`--dist loadfile --no-loadscope-reorder`, pyproject.toml), so the long ones start early and the
# many short ones even out the end. Only the order changes; a module missing here just runs later.
LONGEST_FIRST = ["test_export.py", "test_bad_training.py", "test_bench.py", "test_training.py", "test_predict.py",
                 "test_adaptive.py", "test_doctor.py", "test_pretraining.py", "test_ddp.py", "test_serve.py",
                 "test_data.py", "test_layering.py"]


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order otherwise
