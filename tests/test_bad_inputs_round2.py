"""Nothing lost, nothing silent, round 2 (issue 22): every writer refuses a bad target and never half-writes, every
option that sizes memory is bounded up front, an empty health sample never stops training, and the smaller
messages say what to do."""

import errno
import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
import torch

import predict
import train
import prune
from conftest import ONE_PROBE
from data.files import WriteError, write_atomically, write_text
from inference.classifier import COUNT_CHARACTERS, read_checkpoint
from model.config import MAX_LENGTH, ConfigError, NetworkConfig
from test_explain import save_checkpoint, tiny_classifier

ROOT = Path(__file__).resolve().parents[1]
SMOKE = str(ROOT / "configs" / "smoke.yaml")
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
SHORT = ["--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2"]
SYNTHETIC = {"dataset": "synthetic", "data_dir": None, "train_file": None, "val_file": None, "test_file": None,
             "text_column": None, "label_column": None, "val_fraction": 0.1, "seed": 0}


def fit(root, *extra):
    return train.main(["fit", "--config", SMOKE, "--data.cache_dir", str(root / "cache"),
                       "--trainer.default_root_dir", str(root), *QUIET, *ONE_PROBE, *SHORT, *extra])


def error_line(stop: pytest.ExceptionInfo) -> str:
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message
    return message


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint in train.py's layout over the synthetic task's labels, written without training."""
    import lightning

    classifier = tiny_classifier()
    classifier.label_names = ["0", "1"]
    path = save_checkpoint(classifier, tmp_path / "full.ckpt", data=SYNTHETIC)
    torch.save(read_checkpoint(path) | {"pytorch-lightning_version": lightning.__version__}, path)
    return path


# --- one writer for every file: data/files.py ------------------------------------------------------------------------


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "page.html"
    target.write_text("the old page")

    def fail(path):
        path.write_text("half a pa")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed\nmore")

    with pytest.raises(WriteError, match=r"page.html: cannot write the report: PytorchStreamWriter failed") as e:
        write_atomically(target, fail, "report")
    assert "\n" not in str(e.value)
    assert target.read_text() == "the old page" and sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]


def test_a_directory_or_the_input_itself_is_refused_as_a_target(tmp_path):
    source = tmp_path / "in.ckpt"
    source.write_bytes(b"input")
    with pytest.raises(WriteError, match="is a directory"):
        write_text(tmp_path, "x", "report")
    with pytest.raises(WriteError, match=r"is the checkpoint's own input"):
        write_text(tmp_path / "." / "in.ckpt", "x", "checkpoint", inputs=[source])
    with pytest.raises(WriteError, match="does not exist"):
        write_text(tmp_path / "missing" / "out", "x")
    assert source.read_bytes() == b"input"


def test_a_new_file_gets_the_usual_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    umask = os.umask(0o022)
    try:
        fresh = write_text(tmp_path / "new.txt", "a")
        kept = tmp_path / "kept.txt"
        kept.write_text("old")
        kept.chmod(0o640)
        write_text(kept, "new")
    finally:
        os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o644 and kept.stat().st_mode & 0o777 == 0o640
    assert kept.read_text() == "new"


# --- prune.py -------------------------------------------------------------------------------------------------------


def no_computation(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("computed before the inputs were checked")

    monkeypatch.setattr(prune, "head_importance", fail)


@pytest.mark.parametrize("target", ["same", "directory"])
def test_prune_heads_refuses_its_input_or_a_directory_as_out_before_computing(checkpoint, tmp_path, monkeypatch,
                                                                             target):
    no_computation(monkeypatch)
    before = digest(checkpoint)
    out = checkpoint if target == "same" else tmp_path
    with pytest.raises(SystemExit) as stop:
        prune.main(["--ckpt", str(checkpoint), "--prune", "1", "--out", str(out)])
    line = error_line(stop)
    assert line.startswith(f"error: {out}: ") and ("own input" in line if target == "same" else "directory" in line)
    assert digest(checkpoint) == before


def test_prune_heads_reports_a_failed_save_in_one_line_and_writes_nothing(checkpoint, tmp_path, monkeypatch):
    def full_disk(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"PK half")
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 192 vs 64")

    out = tmp_path / "pruned.ckpt"
    monkeypatch.setattr(prune.torch, "save", full_disk)
    with pytest.raises(SystemExit) as stop:
        prune.main(["--ckpt", str(checkpoint), "--importance-limit", "20", "--limit", "20", "--no-table",
                    "--prune", "1", "--out", str(out)])
    assert error_line(stop).startswith(f"error: {out}: cannot write the pruned checkpoint: [enforce fail")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.ckpt"]


# --- predict.py -----------------------------------------------------------------------------------------------------


def test_ig_steps_and_batch_size_have_an_upper_bound(checkpoint, capsys):
    for option in ("--ig-steps", "--batch-size"):
        with pytest.raises(SystemExit) as stop:
            predict.main(["--ckpt", str(checkpoint), "--explain", option, "100000000", "alpha"])
        assert stop.value.code == 2
        assert f"argument {option}: must be in 1.." in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"ig_steps .* must be in 1..1024, got 100000"):
        tiny_classifier().explain(["w1 w2"], ig_steps=100000)


def test_explain_with_only_empty_inputs_keeps_the_page_and_says_why(checkpoint, tmp_path, capsys):
    page = tmp_path / "page.html"
    page.write_text("an earlier report")
    assert predict.main(["--ckpt", str(checkpoint), "--explain", "--html", str(page), " ", ""]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: {page}: not written: every input is empty, there is nothing to explain\n"
    assert page.read_text() == "an earlier report"


def test_explain_counts_empty_inputs_and_refuses_its_input_file_as_the_page(checkpoint, tmp_path, capsys):
    assert predict.main(["--ckpt", str(checkpoint), "--explain", "w1 alpha", " "]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[1]) == {"text": " ", "error": "empty text"}
    assert '1 empty input(s) reported as {"error": "empty text"} (text 2)' in err
    texts = tmp_path / "texts.txt"
    texts.write_text("w1 alpha\n")
    assert predict.main(["--ckpt", str(checkpoint), "--explain", "--file", str(texts), "--html", str(texts)]) == 2
    assert "own input" in capsys.readouterr().err and texts.read_text() == "w1 alpha\n"


def test_the_truncation_note_gives_the_texts_own_length_in_tokens(checkpoint, capsys):
    long_text = " ".join(["alpha"] * 3000)  # 15,000 characters: cut to 12 × 50 before tokenizing
    assert predict.main(["--ckpt", str(checkpoint), long_text]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["truncated_from"] == 3000
    assert "text 1: 3000 tokens, truncated to the model's max_length of 12" in err
    huge = "alpha " * (COUNT_CHARACTERS // 6 + 10)
    assert predict.main(["--ckpt", str(checkpoint), "--explain", huge]) == 0
    counted = len(huge[:COUNT_CHARACTERS].split())  # a word tokenizer: one token per word
    assert f"text 1: at least {counted} tokens; explained as" in capsys.readouterr().err


def test_help_documents_the_local_bands_slots_outside_the_text(capsys):
    with pytest.raises(SystemExit):
        predict.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "local/sparse: a position below 0 or past the last token is a band slot outside the text" in help_text


# --- upper bounds on what sizes memory -------------------------------------------------------------------------------


@pytest.mark.parametrize("settings, message", [
    ({"attention": "local", "window": 100000, "max_length": 128}, "window 100000 is larger than max_length 128"),
    ({"attention": "sparse", "window": 200, "max_length": 128}, "window 200 is larger than max_length 128"),
    ({"max_length": MAX_LENGTH + 1}, f"max_length {MAX_LENGTH + 1} is larger than {MAX_LENGTH}"),
    ({"d_model": 100000, "n_heads": 2}, "the network would have"),
    ({"vocab_size": 10**9}, "the network would have"),
    ({"d_ff": 10**8}, "the network would have"),
])
def test_settings_that_size_memory_are_bounded_before_anything_is_built(settings, message):
    with pytest.raises(ConfigError, match=message) as error:
        NetworkConfig(**settings)
    assert "\n" not in str(error.value)


def test_a_window_as_long_as_the_text_is_still_allowed():
    NetworkConfig(attention="local", window=128, max_length=128)
    NetworkConfig(attention="full", window=64, max_length=8)  # window is not used by full attention


@pytest.mark.parametrize("option, value", [("batch_size", 10**7), ("max_length", 10**6), ("vocab_size", 10**9)])
def test_data_sizes_are_bounded(option, value):
    from data import DataError
    from data.datamodule import TextDataModule

    with pytest.raises(DataError, match=f"data.{option} {value} is larger than"):
        TextDataModule(dataset="synthetic", **{option: value})
    with pytest.raises(DataError, match=r"data.num_workers must be in 0\.\.\d+, got 100000"):
        TextDataModule(dataset="synthetic", num_workers=100000)


def test_a_checkpoint_write_that_fails_keeps_the_previous_one_whole(tmp_path, monkeypatch):
    """Lightning's checkpoints go through the atomic writer: a write that dies (a full disk, a kill) in the second
    epoch leaves the first epoch's last.ckpt as it was, and training stops with one line."""
    from lightning.fabric.plugins.io import torch_io

    fit(tmp_path, "--trainer.max_epochs", "1")
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    before = digest(last)

    def dies_half_way(checkpoint, path):
        Path(path).write_bytes(b"PK\x03\x04 half a checkpoint")
        raise RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed")

    monkeypatch.setattr(torch_io, "_atomic_save", dies_half_way)
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--trainer.max_epochs", "2", "--ckpt_path", "last")
    assert "cannot write the checkpoint: PytorchStreamWriter failed" in error_line(stop)
    assert digest(last) == before and not list(last.parent.glob(".*.tmp"))


@pytest.mark.parametrize("option", ["num_probes", "max_tokens"])
def test_monitor_figure_sizes_are_bounded(option):
    from monitor import AttentionMonitor

    with pytest.raises(ConfigError, match=f"AttentionMonitor {option} must be in"):
        AttentionMonitor(**{option: 100000})


def test_a_huge_window_from_train_py_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--model.network.attention", "local", "--model.network.window", "100000")
    assert "window 100000 is larger than max_length 24" in error_line(stop)
    assert not (tmp_path / "lightning_logs").exists()


# --- train.py --------------------------------------------------------------------------------------------------------


def test_max_length_1_trains_and_checkpoints_with_an_empty_health_sample(tmp_path, caplog):
    """No query has two keys: the health figures are a "no-data" note and the weight histogram is skipped."""
    caplog.set_level(logging.INFO, logger="monitor.callback")
    fit(tmp_path, "--data.max_length", "1", "--trainer.max_epochs", "1")
    assert (tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    assert "attention the model: no-data: " in caplog.text


def test_a_read_only_filesystem_for_the_logs_is_one_line(tmp_path, monkeypatch):
    real = os.makedirs

    def read_only(path, *args, **kwargs):
        if "lightning_logs" in str(path):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "makedirs", read_only)
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--trainer.max_epochs", "1")
    line = error_line(stop)
    assert "lightning_logs" in line and "read-only file system" in line and "--trainer.default_root_dir" in line


def test_fit_from_a_weights_only_checkpoint_says_it_cannot_resume(tmp_path, checkpoint, capsys):
    pruned = tmp_path / "pruned.ckpt"
    assert prune.main(["--ckpt", str(checkpoint), "--importance-limit", "20", "--limit", "20", "--no-table",
                       "--prune", "1", "--out", str(pruned)]) == 0
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--ckpt_path", str(pruned), "--trainer.max_epochs", "1")
    line = error_line(stop)
    assert line.startswith(f"error: {pruned}: holds the weights only") and "cannot resume" in line
    assert "predict.py" in line


def test_ckpt_path_last_without_a_checkpoint_says_it_starts_fresh(tmp_path, caplog):
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)  # a run killed before its first checkpoint
    with caplog.at_level(logging.WARNING, logger="train"):
        fit(tmp_path, "--ckpt_path", "last", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1")
    assert "--ckpt_path last: no run under" in caplog.text and "starting a fresh run" in caplog.text


# --- data ------------------------------------------------------------------------------------------------------------


def test_labels_that_differ_only_by_surrounding_spaces_are_one_class(tmp_path, caplog):
    from test_bad_data import csv_file, splits_of

    path = csv_file(tmp_path, "".join(f"good film {i},pos\ngood one {i}, pos \nbad film {i},neg \n" for i in range(6)))
    splits = splits_of(path)
    assert splits.label_names == ["neg", "pos"]
    assert "removed the spaces around 12 of 18 labels (e.g. ' pos ' → 'pos')" in caplog.text


def test_an_unreadable_cache_names_the_reason(tmp_path, caplog):
    from test_bad_data import datamodule

    data = datamodule(tmp_path)
    path = data.cache_path()
    data.state  # noqa: B018  (writes the cache)
    path.write_bytes(b"")
    datamodule(tmp_path).state  # noqa: B018
    assert "unreadable cache (EOFError" in caplog.text or "unreadable cache (RuntimeError: " in caplog.text
    assert "unreadable cache ()" not in caplog.text


def test_the_emoji_only_teacher_hint_names_both_settings():
    from data import DataError
    from data.teacher import out_of_fold_probabilities

    with pytest.raises(DataError, match=r"--data.teacher null --model.distillation 0"):
        out_of_fold_probabilities(["🙂🙂", "🙁", "🙂", "🙁🙁"] * 5, [1, 0, 1, 0] * 5, 2, seed=0,
                                  source="emoji.csv")


# --- special checkpoint names and pruned networks in train.py --------------------------------------------------------


@pytest.mark.parametrize("subcommand, name", [("validate", "last"), ("test", "last"), ("validate", "best")])
def test_a_special_checkpoint_name_with_nothing_behind_it_is_one_line(tmp_path, subcommand, name):
    with pytest.raises(SystemExit) as stop:
        train.main([subcommand, "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"),
                    "--trainer.default_root_dir", str(tmp_path), "--ckpt_path", name, *QUIET, *SHORT])
    assert error_line(stop).startswith(f"error: --ckpt_path {name}: ")
    assert not (tmp_path / "lightning_logs").exists()


def test_a_checkpoint_train_py_did_not_write_is_one_line_in_train_py(tmp_path):
    path = save_checkpoint(tiny_classifier(), tmp_path / "by_hand.ckpt")
    with pytest.raises(SystemExit) as stop:
        train.main(["validate", "--config", SMOKE, "--ckpt_path", str(path), "--data.cache_dir", str(tmp_path / "cache"),
                    *QUIET])
    assert error_line(stop).startswith(f"error: {path}: not written by train.py")


def test_a_pruned_network_with_other_head_counts_per_layer_is_validated_with_the_monitor(checkpoint, tmp_path):
    pruned = tmp_path / "pruned.ckpt"
    assert prune.main(["--ckpt", str(checkpoint), "--importance-limit", "20", "--limit", "20", "--no-table",
                       "--prune", "1", "--out", str(pruned)]) == 0
    assert sorted(read_checkpoint(pruned)["hyper_parameters"]["network"]["layer_heads"]) == [1, 2]
    cli = train.main(["validate", "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"),
                      "--data.max_length", "12", "--trainer.default_root_dir", str(tmp_path), "--ckpt_path",
                      str(pruned), *QUIET, *ONE_PROBE, *SHORT])
    assert "val/acc" in cli.trainer.callback_metrics
    (monitor,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "AttentionMonitor"]
    assert sorted(monitor.figures.heads_of(layer) for layer in range(2)) == [1, 2]


def test_health_figures_cover_the_heads_each_layer_has():
    from model.attention import AttentionWeights
    from monitor.health import AttentionHealth

    def layer(heads):
        scores = torch.randn(2, heads, 5, 5)
        return AttentionWeights(scores.softmax(-1), scores, None)

    health = AttentionHealth()
    health.update([layer(1), layer(2)])
    figures = health.compute()
    assert [figures.heads_of(layer) for layer in range(2)] == [1, 2] and figures.heads == [1, 2]
    assert figures.entropy[0, 1].isnan() and not figures.entropy[1].isnan().any()
    assert figures.weight_sample[0, 1].isnan().all() and not figures.weight_sample[1].isnan().any()


def test_running_out_of_gpu_memory_is_one_line(tmp_path, monkeypatch):
    from training.module import ClassifierModule

    def out_of_memory(self, batch, batch_idx):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 240.00 GiB")

    monkeypatch.setattr(ClassifierModule, "training_step", out_of_memory)
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--trainer.max_epochs", "1")
    assert error_line(stop) == "error: out of memory on the GPU; lower data.batch_size or data.max_length"
