"""Nothing lost, nothing silent, in train.py and the Python API: bad checkpoints, failed resumes, NaN losses."""

import hashlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from conftest import ONE_PROBE, QUIET, ROOT, SMOKE
from inference import TextClassifier

SHORT = ["--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "2"]


def fit(root, *extra):
    return train.main(["fit", "--config", SMOKE, "--data.cache_dir", str(root / "cache"),
                       "--trainer.default_root_dir", str(root), *QUIET, *ONE_PROBE, *SHORT, *extra])


def script(root, *args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args, "--data.cache_dir", str(root / "cache"),
         "--trainer.default_root_dir", str(root), *QUIET, *SHORT],
        cwd=root, capture_output=True, text=True,
    )


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


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
                    str(tmp_path / "cache"), "--trainer.default_root_dir", str(tmp_path), *QUIET, *SHORT])
    line = str(stop.value.code)
    assert line.startswith(f"error: {path}: ") and message in line and "\n" not in line
    assert not (Path(__file__).parent / "PWNED").exists()


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


def test_a_failed_resume_keeps_the_runs_config_and_checkpoint(run, capfd):
    root, version = run
    config, last = version / "config.yaml", version / "checkpoints" / "last.ckpt"
    before = digest(config), digest(last)
    line = refused_in_process(capfd, root, "--trainer.max_epochs", "2", "--ckpt_path", "last",
                              "--model.network.d_model", "64")
    assert "trained with d_model 32 (this config: 64)" in line and "config.yaml" in line
    assert (digest(config), digest(last)) == before


def test_resuming_with_other_labels_is_refused_before_anything_is_written(run, tmp_path, capfd):
    root, version = run
    other = tmp_path / "other.csv"
    other.write_text("text,label\n" + "".join(f"w{i} w{i + 1},{'cat' if i % 2 else 'dog'}\n" for i in range(60)))
    before = digest(version / "config.yaml")
    line = refused_in_process(capfd, root, "--trainer.max_epochs", "2", "--ckpt_path", "last",
                              "--data.train_file", str(other))
    assert "trained on label names ['0', '1'], but this data has ['cat', 'dog']" in line
    assert digest(version / "config.yaml") == before


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
                    "--trainer.default_root_dir", str(tmp_path), *QUIET, *ONE_PROBE, *SHORT, "--ckpt_path", str(old)])
    assert str(stop.value.code).startswith(f"error: {old}: a checkpoint of an earlier layout")
    assert "version 0.1.0 of this project" in str(stop.value.code)
    assert not (tmp_path / "lightning_logs").exists()


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


def test_test_without_a_labelled_test_split_is_one_line_and_leaves_no_run_folder(run, tmp_path):
    _, version = run
    with pytest.raises(SystemExit) as stop:
        train.main(["test", "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"),
                    "--trainer.default_root_dir", str(tmp_path), *QUIET, *ONE_PROBE, *SHORT,
                    "--ckpt_path", str(version / "checkpoints" / "last.ckpt")])
    assert str(stop.value.code).startswith("error: no test split") and "`validate`" in str(stop.value.code)
    assert not (tmp_path / "lightning_logs").exists()
