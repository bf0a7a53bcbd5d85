"""A run's folder (training/runs.py): a given test file scored at the end of the fit, `test` on one of the run's
checkpoints working in that run (its data cache and teacher, its folder, its config.yaml), resuming from the path
of last.ckpt keeping the run's best, and a full disk under TensorBoard's writer thread naming the file."""

import errno
import logging
import threading
import warnings

import pytest

import train
from conftest import fit, marker_rows, write_csv
from training import runs


@pytest.mark.slow
def test_a_given_test_file_is_scored_and_testing_the_run_reuses_its_data_teacher_and_folder(tmp_path, caplog,
                                                                                            monkeypatch):
    train_file, test_file = write_csv(tmp_path / "train.csv", marker_rows(120)), write_csv(
        tmp_path / "test.csv", marker_rows(30, seed=5))
    with caplog.at_level(logging.INFO, logger="train"):  # its level: a bench in this process raises it
        cli = fit(tmp_path, "--data.train_file", str(train_file), "--data.test_file", str(test_file),
                  "--data.teacher", "ngram", "--model.distillation", "0.5", "--data.vocab_size", "null",
                  "--data.max_length", "null", "--trainer.max_epochs", "2")
    run = tmp_path / "lightning_logs" / "version_0"
    best = cli.trainer.checkpoint_callback.best_model_path
    assert f"scoring the test file {test_file} with the best checkpoint {best}" in caplog.text
    fitted_accuracy = float(cli.trainer.callback_metrics["test/acc"])

    config = (run / "config.yaml").read_text()

    def no_refit(*args, **kwargs):
        raise AssertionError("the teacher was fitted again")

    monkeypatch.setattr("training.teacher.out_of_fold_probabilities", no_refit)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tested = train.main(["test", "--config", str(run / "config.yaml"), "--ckpt_path", best])
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]  # no new version_1 beside the run
    assert (run / "config.yaml").read_text() == config  # still the fit's
    assert float(tested.trainer.callback_metrics["test/acc"]) == pytest.approx(fitted_accuracy)


@pytest.mark.slow
def test_resuming_from_the_path_of_last_ckpt_keeps_the_runs_best(tmp_path):
    first = fit(tmp_path, "--trainer.max_epochs", "2")
    best = first.trainer.checkpoint_callback
    best_path, best_score = best.best_model_path, float(best.best_model_score)
    run = tmp_path / "lightning_logs" / "version_0"
    resumed = fit(tmp_path, "--trainer.max_epochs", "3", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"))
    carried = resumed.trainer.checkpoint_callback
    assert sorted(p.name for p in run.parent.iterdir()) == ["version_0"]
    assert float(carried.best_model_score) >= best_score  # the run's best is still counted
    assert carried.best_model_path == best_path or float(carried.best_model_score) > best_score


def test_a_full_disk_under_the_tensorboard_writer_names_the_event_file(tmp_path, monkeypatch, capfd):
    from tensorboard.summary.writer.record_writer import RecordWriter
    from torch.utils.tensorboard import SummaryWriter

    monkeypatch.setattr(threading, "excepthook", threading.excepthook)  # restored after the test
    runs.name_writer_errors()
    writer = SummaryWriter(str(tmp_path))
    writer.flush()

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RecordWriter, "write", full)
    with pytest.raises(OSError) as stop:
        writer.add_scalar("loss", 1.0, 0)
        writer.flush()
    runs.wait_for_writer(stop.value)
    assert stop.value.filename and stop.value.filename.startswith(str(tmp_path / "events.out.tfevents"))
    assert "Traceback" not in capfd.readouterr().err  # the thread's own traceback is left out


def test_a_run_records_its_data_files_in_its_checkpoints(smoke_run):
    import torch

    stat = smoke_run.train_file.stat()
    recorded = torch.load(smoke_run.best, weights_only=True)["data_files"]
    assert recorded == [[str(smoke_run.train_file.resolve()), stat.st_size, int(stat.st_mtime)]]


def test_diagnose_notes_a_data_file_changed_since_training(tmp_path):
    from inference.diagnosis import data_changes

    path = write_csv(tmp_path / "train.csv", marker_rows(20))
    stat = path.stat()
    checkpoint = {"data_files": [[str(path.resolve()), stat.st_size, int(stat.st_mtime)]]}
    assert data_changes(checkpoint, {"train_file": str(path)}) == []
    with open(path, "a") as f:
        f.write("a new text,alpha first\n")
    (note,) = data_changes(checkpoint, {"train_file": str(path)})
    assert f"data file changed since training: {path.resolve()} ({stat.st_size} bytes then, " in note
    assert data_changes(checkpoint, {"train_file": str(tmp_path / "other.csv")}) == []  # other data given
    path.unlink()
    assert "missing now" in data_changes(checkpoint, {"train_file": str(path)})[0]
