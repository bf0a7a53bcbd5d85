"""Nothing lost, nothing silent, in train.py and the Python API: bad checkpoints, failed resumes, NaN losses."""

import errno
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import prune
import train
from conftest import ONE_PROBE, QUIET, ROOT, SMOKE, digest, error_line, save_checkpoint, tiny_classifier
from conftest import fit as smoke_fit
from inference import TextClassifier

# The resume and NaN tests count steps: 6 per epoch.
SIX_BATCHES = ["--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "2"]


def fit(root, *extra):
    return smoke_fit(root, *SIX_BATCHES, *extra)


def script(root, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args, "--data.cache_dir", str(root / "cache"),
         "--trainer.default_root_dir", str(root), *QUIET, *SIX_BATCHES],
        cwd=root, capture_output=True, text=True,
    )


def one_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0
    assert "Traceback" not in result.stderr and "weights_only=False" not in result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    return line


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One finished epoch: the run's folder and its last.ckpt."""
    root = tmp_path_factory.mktemp("run")
    fit(root, "--trainer.max_epochs", "1")
    return root, root / "lightning_logs" / "version_0"


class Evil:
    def __reduce__(self):
        return (os.system, (f"touch {Path(__file__).parent / 'PWNED'}",))


def bad_checkpoint(kind: str, folder: Path, good: Path) -> Path:
    path = folder / f"{kind}.ckpt"
    if kind == "truncated":
        path.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "pickle":
        path.write_bytes(pickle.dumps({"state_dict": {}}, protocol=4))
    elif kind == "code":
        torch.save({"state_dict": {}, "hyper_parameters": {}, "payload": Evil()}, path)
    elif kind == "text":
        path.write_text("not a checkpoint")
    elif kind == "directory":
        path.mkdir()
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind, message",
    [
        ("truncated", "truncated or damaged"),
        ("empty", "empty file"),
        ("pickle", "a plain pickle file"),
        ("code", "could run code"),
        ("text", "not a zip archive"),
        ("directory", "is a directory"),
        ("missing", "file not found"),
    ],
)
def test_a_bad_checkpoint_is_refused_in_one_line_naming_it(run, tmp_path, kind, message):
    root, version = run
    path = bad_checkpoint(kind, tmp_path, version / "checkpoints" / "last.ckpt")
    with pytest.raises(SystemExit) as stop:  # train.main's own exit: the line the process prints on stderr
        train.main(["validate", "--config", SMOKE, "--ckpt_path", str(path), "--data.cache_dir",
                    str(tmp_path / "cache"), "--trainer.default_root_dir", str(tmp_path), *QUIET, *SIX_BATCHES])
    line = str(stop.value.code)
    assert line.startswith(f"error: {path}: ") and message in line and "\n" not in line
    assert not (Path(__file__).parent / "PWNED").exists()


@pytest.mark.slow  # a fresh Python process
def test_a_checkpoint_that_would_run_code_is_refused_by_a_real_process_without_a_traceback(run, tmp_path):
    root, version = run
    path = bad_checkpoint("code", tmp_path, version / "checkpoints" / "last.ckpt")
    line = one_error_line(script(tmp_path, "validate", "--config", SMOKE, "--ckpt_path", str(path)))
    assert line.startswith(f"error: {path}: ") and "could run code" in line
    assert not (Path(__file__).parent / "PWNED").exists()


def refused_in_process(capfd, root, *extra) -> str:
    """train.main's own exit, in this process: the one line the real process prints (the real-process tests here
    show that line is all it prints), and nothing on stderr that looks like a traceback."""
    with pytest.raises(SystemExit) as stop:
        fit(root, *extra)
    line = str(stop.value.code)
    assert line.startswith("error: ") and "\n" not in line
    assert "Traceback" not in capfd.readouterr().err
    return line


@pytest.mark.slow
def test_a_failed_resume_keeps_the_runs_config_and_checkpoint(run, capfd):
    root, version = run
    config, last = version / "config.yaml", version / "checkpoints" / "last.ckpt"
    before = digest(config), digest(last)
    line = refused_in_process(capfd, root, "--trainer.max_epochs", "2", "--ckpt_path", "last",
                              "--model.network.d_model", "64")
    assert "trained with d_model 32 (this config: 64)" in line and "config.yaml" in line
    assert (digest(config), digest(last)) == before


@pytest.mark.slow
def test_resuming_with_other_labels_is_refused_before_anything_is_written(run, tmp_path, capfd):
    root, version = run
    other = tmp_path / "other.csv"
    other.write_text("text,label\n" + "".join(f"w{i} w{i + 1},{'cat' if i % 2 else 'dog'}\n" for i in range(60)))
    before = digest(version / "config.yaml")
    line = refused_in_process(capfd, root, "--trainer.max_epochs", "2", "--ckpt_path", "last",
                              "--data.train_file", str(other))
    assert "trained on label names ['0', '1'], but this data has ['cat', 'dog']" in line
    assert digest(version / "config.yaml") == before


@pytest.mark.slow
def test_a_nan_loss_stops_training_in_one_line_and_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    """The loss turns NaN in the second epoch (step 8 of 6 per epoch): training stops at once with one line,
    and the checkpoints of the first epoch stay as they were."""
    import training.module

    calls, original = [], torch.nn.functional.cross_entropy

    def cross_entropy(*args, **kwargs):
        loss = original(*args, **kwargs)
        if "label_smoothing" not in kwargs:  # validation
            return loss
        calls.append(1)
        return loss * float("nan") if len(calls) == 3 else loss  # resumed at step 6: NaN at step 8

    fit(tmp_path, "--trainer.max_epochs", "1")
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    before = digest(last)
    monkeypatch.setattr(training.module.F, "cross_entropy", cross_entropy)
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--trainer.max_epochs", "3", "--ckpt_path", "last")
    message = str(stop.value.code)
    assert message.startswith("error: training loss is nan at step 8 (epoch 1)") and "--model.lr" in message
    assert "\n" not in message
    assert digest(last) == before
    state = torch.load(last, weights_only=True)["state_dict"]
    assert all(torch.isfinite(tensor).all() for tensor in state.values())


@pytest.mark.slow  # a fresh Python process
def test_a_huge_learning_rate_ends_in_the_nan_line_not_a_traceback(tmp_path):
    line = one_error_line(script(tmp_path, "fit", "--config", SMOKE, "--trainer.max_epochs", "2", "--model.lr", "1e4"))
    assert "training loss is nan" in line


def test_a_checkpoint_of_an_earlier_layout_is_refused_before_a_run_folder_is_made(run, tmp_path):
    _, version = run
    checkpoint = torch.load(version / "checkpoints" / "last.ckpt", weights_only=True)
    network = checkpoint["hyper_parameters"].pop("network")
    checkpoint["hyper_parameters"].update({k: v for k, v in network.items() if k not in ("num_classes",
                                                                                          "attention_kernel")})
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    with pytest.raises(SystemExit) as stop:  # train.main's own exit: the line the process prints on stderr
        train.main(["validate", "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"),
                    "--trainer.default_root_dir", str(tmp_path), *QUIET, *ONE_PROBE, *SIX_BATCHES, "--ckpt_path", str(old)])
    assert str(stop.value.code).startswith(f"error: {old}: a checkpoint of an earlier layout")
    assert "version 0.1.0 of this project" in str(stop.value.code)
    assert not (tmp_path / "lightning_logs").exists()


def test_the_checkpoint_upgrade_command_that_scripts_may_call_says_in_one_line_what_reads_old_checkpoints(capsys):
    from training import checkpoints

    assert checkpoints.main(["upgrade", "old.ckpt", "new.ckpt"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "no such command" in err and "version 0.1.0" in err


@pytest.mark.slow
def test_a_resumed_run_shows_each_step_once_in_tensorboard(tmp_path):
    """An interrupted run logged steps past its last checkpoint; after resuming, TensorBoard shows them once."""
    fit(tmp_path, "--trainer.max_epochs", "2", "--trainer.log_every_n_steps", "1")
    version = tmp_path / "lightning_logs" / "version_0"
    checkpoints = sorted((version / "checkpoints").glob("best-*.ckpt"))
    first_epoch = torch.load(checkpoints[0], weights_only=True)
    torch.save(first_epoch, version / "checkpoints" / "last.ckpt")  # as if killed during the second epoch
    fit(tmp_path, "--trainer.max_epochs", "2", "--trainer.log_every_n_steps", "1", "--ckpt_path", "last")
    events = EventAccumulator(str(version), size_guidance={"scalars": 0})
    events.Reload()
    steps = [event.step for event in events.Scalars("train/loss")]
    assert len(steps) == len(set(steps)) == 12


@pytest.mark.parametrize("bad", [None, 123, b"bytes"])
def test_predict_refuses_texts_that_are_not_strings_in_one_line(run, bad):
    _, version = run
    classifier = TextClassifier.from_checkpoint(version / "checkpoints" / "last.ckpt", device="cpu")
    with pytest.raises(TypeError, match=r"not a string at position\(s\) 1 \(") as error:
        classifier.predict(["w1 w2", bad])
    assert "\n" not in str(error.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
@pytest.mark.slow  # a fresh Python process
def test_a_read_only_log_folder_is_one_line(tmp_path):
    root = tmp_path / "locked"
    root.mkdir()
    root.chmod(0o500)
    try:
        result = script(root, "fit", "--config", SMOKE, "--trainer.max_epochs", "1")
    finally:
        root.chmod(0o700)
    assert "permission denied" in one_error_line(result)


def test_a_checkpoint_of_another_max_length_or_other_labels_is_refused_in_one_line():
    from data.checkpoint import CheckpointError
    from model.config import NetworkConfig
    from training.checkpoints import check_fits

    checkpoint = {"hyper_parameters": {"network": NetworkConfig(max_length=64).to_dict(), "label_names": ["0", "1"]}}
    with pytest.raises(CheckpointError, match=r"^x.ckpt: trained with max_length 64 \(this config: 128\); use the"):
        check_fits("x.ckpt", checkpoint, NetworkConfig(max_length=128), ["0", "1"])
    with pytest.raises(CheckpointError, match=r"^x.ckpt: trained on label names \['0', '1'\], but this data has"):
        check_fits("x.ckpt", checkpoint, NetworkConfig(max_length=64), ["neg", "pos"])


@pytest.mark.slow
def test_test_without_a_labelled_test_split_is_one_line_and_leaves_no_run_folder(run, tmp_path):
    _, version = run
    with pytest.raises(SystemExit) as stop:
        train.main(["test", "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"),
                    "--trainer.default_root_dir", str(tmp_path), *QUIET, *ONE_PROBE, *SIX_BATCHES,
                    "--ckpt_path", str(version / "checkpoints" / "last.ckpt")])
    assert str(stop.value.code).startswith("error: no test split") and "`validate`" in str(stop.value.code)
    assert not (tmp_path / "lightning_logs").exists()


@pytest.mark.slow
def test_a_checkpoint_write_that_fails_keeps_the_previous_one_whole(tmp_path, monkeypatch):
    """Lightning's checkpoints go through the atomic writer: a write that dies (a full disk, a kill) in the second
    epoch leaves the first epoch's last.ckpt as it was, and training stops with one line."""
    from lightning.fabric.plugins.io import torch_io

    fit(tmp_path, "--trainer.max_epochs", "1")
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    before = digest(last)

    def dies_half_way(tiny_checkpoint, path):
        Path(path).write_bytes(b"PK\x03\x04 half a checkpoint")
        raise RuntimeError("PytorchStreamWriter failed writing file data/3: file write failed")

    monkeypatch.setattr(torch_io, "_atomic_save", dies_half_way)
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--trainer.max_epochs", "2", "--ckpt_path", "last")
    assert "cannot write the checkpoint: PytorchStreamWriter failed" in error_line(stop)
    assert digest(last) == before and not list(last.parent.glob(".*.tmp"))


def test_a_huge_window_from_train_py_is_one_line(tmp_path):
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--model.network.attention", "local", "--model.network.window", "100000")
    assert "window 100000 is larger than max_length 24" in error_line(stop)
    assert not (tmp_path / "lightning_logs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--data.max_length", "1000000"], "max_length 1000000 is larger than 65536 tokens"),
    (["--model.network.attention", "banded"], "attention must be one of full, local, linformer, sparse, auto"),
    (["--model.network.attention", "local", "--model.network.window", "0"],
     "window must be a whole number >= 1, got 0"),
])
def test_a_bad_network_setting_is_refused_before_the_data_are_read(tmp_path, flags, message):
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, *flags)
    assert message in error_line(stop)
    assert not (tmp_path / "cache").exists()  # nothing was read, tokenized or cached


@pytest.mark.slow
def test_max_length_1_trains_and_checkpoints_with_an_empty_health_sample(tmp_path, caplog):
    """No query has two keys: the health figures are a "no-data" note and the weight histogram is skipped."""
    caplog.set_level(logging.INFO, logger="monitor.callback")
    fit(tmp_path, "--data.max_length", "1", "--trainer.max_epochs", "1")
    assert (tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    assert "attention the model: no-data: " in caplog.text


@pytest.mark.slow
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


@pytest.mark.slow
def test_fit_from_a_weights_only_checkpoint_says_it_cannot_resume(tmp_path, tiny_checkpoint, capsys):
    pruned = tmp_path / "pruned.ckpt"
    assert prune.main(["--ckpt", str(tiny_checkpoint), "--importance-limit", "20", "--limit", "20", "--no-table",
                       "--prune", "1", "--out", str(pruned)]) == 0
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--ckpt_path", str(pruned), "--trainer.max_epochs", "1")
    line = error_line(stop)
    assert line.startswith(f"error: {pruned}: holds the weights only") and "cannot resume" in line
    assert "predict.py" in line


@pytest.mark.slow
def test_ckpt_path_last_without_a_checkpoint_says_it_starts_fresh(tmp_path, caplog):
    (tmp_path / "lightning_logs" / "version_0").mkdir(parents=True)  # a run killed before its first checkpoint
    with caplog.at_level(logging.WARNING, logger="train"):
        fit(tmp_path, "--ckpt_path", "last", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1")
    assert "--ckpt_path last: no run under" in caplog.text and "starting a fresh run" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("subcommand, name", [("validate", "last"), ("test", "last"), ("validate", "best")])
def test_a_special_checkpoint_name_with_nothing_behind_it_is_one_line(tmp_path, subcommand, name):
    with pytest.raises(SystemExit) as stop:
        train.main([subcommand, "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"),
                    "--trainer.default_root_dir", str(tmp_path), "--ckpt_path", name, *QUIET, *SIX_BATCHES])
    assert error_line(stop).startswith(f"error: --ckpt_path {name}: ")
    assert not (tmp_path / "lightning_logs").exists()


def test_a_checkpoint_train_py_did_not_write_is_one_line_in_train_py(tmp_path):
    path = save_checkpoint(tiny_classifier(), tmp_path / "by_hand.ckpt")
    with pytest.raises(SystemExit) as stop:
        train.main(["validate", "--config", SMOKE, "--ckpt_path", str(path), "--data.cache_dir", str(tmp_path / "cache"),
                    *QUIET])
    assert error_line(stop).startswith(f"error: {path}: not written by train.py")


@pytest.mark.slow
def test_running_out_of_gpu_memory_is_one_line(tmp_path, monkeypatch):
    from training.module import ClassifierModule

    def out_of_memory(self, batch, batch_idx):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 240.00 GiB")

    monkeypatch.setattr(ClassifierModule, "training_step", out_of_memory)
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--trainer.max_epochs", "1")
    assert error_line(stop) == "error: out of memory on the GPU; lower data.batch_size or data.max_length"
