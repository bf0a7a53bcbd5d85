"""Sizes and training length chosen from the data, written into config.yaml; early stopping; the fixed test split;
ensembles of checkpoints."""

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

import predict
import train
import training.length
from conftest import ONE_PROBE, QUIET, SMOKE
from data import DataError, TextDataModule
from data.sizes import MAX_LENGTH_CAP, RARE_WORD_SHARE
from data.sources import load_splits
from inference import TextClassifier
from data.checkpoint import resolve_checkpoint
from inference.ensemble import Ensemble
from monitor import AttentionMonitor



def write_csv(path: Path, rows) -> Path:
    lines = ["text,label"] + [f'"{text}",{label}' for text, label in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_vocab_size_is_the_words_seen_twice_and_max_length_the_longest_text_rounded_to_8(tmp_path):
    # Words: "good" ×31, "bad" ×30, "film" ×60, "x" ×2; "rare" once: 1 of 124 words, under RARE_WORD_SHARE.
    rows = [("good film", 1), ("bad film", 0)] * 30 + [("good rare x", 1), ("x", 0)]
    data = TextDataModule(train_file=str(write_csv(tmp_path / "train.csv", rows)),
                          val_file=str(write_csv(tmp_path / "val.csv", [("good", 1), ("bad", 0)])),
                          tokenizer="word", cache_dir=str(tmp_path / "cache"))
    assert data.vocab_size == 4 + 2  # good, bad, film, x + [PAD], [UNK]
    assert data.tokenizer.get_vocab_size() == 6 and data.tokenizer.token_to_id("rare") is None
    assert data.max_length == 8  # the longest training text has 3 words: rounded up to a multiple of 8
    assert data.hparams.max_length is None and data.hparams.vocab_size is None  # chosen, not configured


def test_small_data_keeps_the_words_seen_once_too(tmp_path):
    # "rare1".."rare3" once each: 3 of 23 words (13%), above RARE_WORD_SHARE, so they are kept; "unseen" is only in
    # the validation file, which does not choose the vocabulary.
    rows = [("good film", 1), ("good film", 1), ("good plot", 1), ("bad film", 0), ("bad film", 0), ("bad plot", 0),
            ("good good good rare1 rare2 rare3 bad bad bad x", 1), ("x", 0)]
    assert RARE_WORD_SHARE < 3 / 23
    data = TextDataModule(train_file=str(write_csv(tmp_path / "train.csv", rows)),
                          val_file=str(write_csv(tmp_path / "val.csv", [("good unseen", 1), ("bad", 0)])),
                          tokenizer="word", cache_dir=str(tmp_path / "cache"))
    assert data.vocab_size == 8 + 2  # good, bad, film, plot, x, rare1, rare2, rare3 + [PAD], [UNK]
    assert data.tokenizer.token_to_id("rare1") is not None and data.tokenizer.token_to_id("unseen") is None
    assert data.max_length == 16  # the longest training text has 10 words: rounded up to a multiple of 8


def test_vocab_size_cap_keeps_the_most_frequent_words(tmp_path, monkeypatch):
    monkeypatch.setattr("data.sizes.VOCAB_SIZE_CAP", 4)  # [PAD], [UNK] + the two most frequent words
    rows = [("good good good bad bad film", 1), ("good bad plot", 0), ("bad good x", 1), ("film", 0)]
    data = TextDataModule(train_file=str(write_csv(tmp_path / "train.csv", rows)),
                          val_file=str(write_csv(tmp_path / "val.csv", [("good", 1), ("bad", 0)])),
                          tokenizer="word", cache_dir=str(tmp_path / "cache"))
    assert data.vocab_size == 4
    assert {w for w in ("good", "bad", "film", "plot", "x") if data.tokenizer.token_to_id(w) is not None} \
        == {"good", "bad"}


def test_max_length_is_capped(tmp_path):
    long = " ".join(f"w{i % 7}" for i in range(2 * MAX_LENGTH_CAP))
    rows = [(long, 1), ("w1 w2", 0), ("w3", 1), ("w4 w5", 0)]
    data = TextDataModule(train_file=str(write_csv(tmp_path / "train.csv", rows)),
                          val_file=str(write_csv(tmp_path / "val.csv", [("w1", 1), ("w2", 0)])),
                          tokenizer="word", cache_dir=str(tmp_path / "cache"))
    assert data.max_length == MAX_LENGTH_CAP
    assert max(data.split("train").lengths) == MAX_LENGTH_CAP


def test_chosen_sizes_encode_exactly_as_the_same_sizes_given(tmp_path):
    rows = [(f"w{i % 13} w{i % 5} w{i % 3} w{i % 11} {'w7 ' * (i % 9)}", i % 2) for i in range(60)]
    path = write_csv(tmp_path / "train.csv", rows)
    chosen = TextDataModule(train_file=str(path), cache_dir=str(tmp_path / "a"))
    given = TextDataModule(train_file=str(path), max_length=chosen.max_length, vocab_size=chosen.vocab_size,
                           cache_dir=str(tmp_path / "b"))
    assert chosen.state["tokenizer"] == given.state["tokenizer"]
    for split in ("train", "validation"):
        assert torch.equal(chosen.split(split).ids, given.split(split).ids)


@pytest.mark.parametrize("rows, val_rows, message", [
    ([("\x07", 0), ("\x07\x07", 1)] * 3, [("\x07", 0), ("\x07", 1)], "train.csv: every training text is empty after tokenization"),
    ([("a b", 0), ("c d", 1), ("e f", 2)] * 3, [("a", 0), ("c", 1)], "val.csv: 2 validation text(s) for 3 classes"),
])
def test_a_choice_that_cannot_be_made_is_a_one_line_error_naming_the_file(tmp_path, rows, val_rows, message):
    data = TextDataModule(train_file=str(write_csv(tmp_path / "train.csv", rows)),
                          val_file=str(write_csv(tmp_path / "val.csv", val_rows)), cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError) as error:
        data.state  # noqa: B018
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_single_file_registered_dataset_has_a_fixed_stratified_test_split(tmp_path):
    rows = [(f"positive review {i}", 1) for i in range(60)] + [(f"negative review {i}", 0) for i in range(40)]
    folder = tmp_path / "chnsenticorp_htl"
    folder.mkdir()
    (folder / "all.csv").write_text("label,review\n" + "".join(f"{label},{text}\n" for text, label in rows))

    def splits(seed, val_fraction=0.1):
        return load_splits(dataset="chnsenticorp_htl", data_dir=str(folder), train_file=None, val_file=None,
                           test_file=None, text_column=None, label_column=None, val_fraction=val_fraction, seed=seed)

    first, other_seed, other_fraction = splits(0), splits(1), splits(0, 0.2)
    assert sorted(first.labels["test"]) == [0] * 4 + [1] * 6  # 10% of each class
    assert list(first.texts["test"]) == list(other_seed.texts["test"]) == list(other_fraction.texts["test"])  # fixed
    assert list(first.texts["validation"]) != list(other_seed.texts["validation"])  # validation follows data.seed
    assert not set(first.texts["test"]) & (set(first.texts["train"]) | set(first.texts["validation"]))
    assert len(first.texts["train"]) + len(first.texts["validation"]) + len(first.texts["test"]) == 100


@pytest.mark.slow
def test_training_length_with_no_max_epochs_gives_small_data_enough_steps(tmp_path):
    # Synthetic: 3,600 training texts, batch 64 → 57 steps per epoch → ceil(2000 / 57) = 36 epochs.
    cli = train.cli(["--config", SMOKE, "--data.cache_dir", str(tmp_path), "--trainer.max_epochs", "null"], run=False)
    assert cli.trainer.max_epochs == 36 == cli.config["trainer"]["max_epochs"]
    cli = train.cli(["--config", SMOKE, "--data.cache_dir", str(tmp_path), "--trainer.max_epochs", "null",
                     "--data.batch_size", "8"], run=False)
    assert cli.trainer.max_epochs == training.length.MIN_EPOCHS  # 450 steps per epoch: the epoch minimum
    cli = train.cli(["--config", SMOKE, "--data.cache_dir", str(tmp_path)], run=False)
    assert cli.trainer.max_epochs == 10  # set by the config: kept


def stopper(cli):
    (callback,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "EarlyStopping"]
    return callback


@pytest.mark.slow
def test_chosen_training_length_gives_early_stopping_enough_steps(tmp_path):
    # 57 steps per epoch: patience 5 epochs (285 steps) is raised to ceil(300 / 57) = 6, in config.yaml too.
    cli = train.cli(["--config", SMOKE, "--data.cache_dir", str(tmp_path), "--trainer.max_epochs", "null"], run=False)
    assert training.length.PATIENCE_STEPS == 300
    assert stopper(cli).patience == 6 == cli.config["early_stopping"]["patience"]
    cli = train.cli(["--config", SMOKE, "--data.cache_dir", str(tmp_path), "--trainer.max_epochs", "null",
                     "--data.batch_size", "8"], run=False)
    assert stopper(cli).patience == 5  # 450 steps per epoch: 5 epochs are plenty
    cli = train.cli(["--config", SMOKE, "--data.cache_dir", str(tmp_path), "--trainer.max_epochs", "null",
                     "--early_stopping.patience", "20"], run=False)
    assert stopper(cli).patience == 20  # a longer patience is kept
    cli = train.cli(["--config", SMOKE, "--data.cache_dir", str(tmp_path), "--trainer.max_epochs", "null",
                     "--data.batch_size", "1024"], run=False)  # 4 steps per epoch, as a small file has
    assert cli.trainer.max_epochs == 40 and stopper(cli).patience == 20  # not 75: it can stop before the end
    cli = train.cli(["--config", SMOKE, "--data.cache_dir", str(tmp_path)], run=False)
    assert stopper(cli).patience == 5  # the training length is the config's: so is the patience


@pytest.mark.slow
def test_early_stopping_and_the_attention_monitor_are_on_by_default(tmp_path):
    cli = train.cli(["--data.dataset", "synthetic", "--data.cache_dir", str(tmp_path)], run=False)
    monitors = [c for c in cli.trainer.callbacks if isinstance(c, AttentionMonitor)]
    stoppers = [c for c in cli.trainer.callbacks if type(c).__name__ == "EarlyStopping"]
    assert len(monitors) == 1 and len(stoppers) == 1 and stoppers[0].monitor == "val/acc"
    cli = train.cli(["--config", SMOKE, "--data.cache_dir", str(tmp_path)], run=False)  # lists the monitor itself
    assert sum(isinstance(c, AttentionMonitor) for c in cli.trainer.callbacks) == 1


@pytest.mark.slow
def test_early_stopping_ends_a_run_that_stopped_improving_and_last_ckpt_is_its_last_epoch(tmp_path):
    cli = train.main(["fit", "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"), *QUIET,
                      "--trainer.logger.init_args.save_dir", str(tmp_path), "--trainer.callbacks", "[]",
                      "--model.lr", "0", "--early_stopping.patience", "1", "--trainer.limit_train_batches", "2"])
    # lr 0: validation accuracy never changes; epoch 0 sets the best, epoch 1 does not beat it, so it stops.
    assert cli.trainer.current_epoch == 2 and cli.trainer.max_epochs == 10
    folder = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    # epoch 0 is the best; last.ckpt must still be epoch 1, the last one, for resuming.
    assert [p.name.split("-acc")[0] for p in folder.glob("best-*.ckpt")] == ["best-epoch0-step2"]
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 1


@pytest.fixture(scope="module")
def chosen_run(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("chosen")
    cli = train.main(["fit", "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"), *QUIET, *ONE_PROBE,
                      "--trainer.logger.init_args.save_dir", str(tmp_path), "--data.max_length", "null",
                      "--data.vocab_size", "null", "--trainer.max_epochs", "2", "--trainer.limit_train_batches", "10"])
    return tmp_path / "lightning_logs" / "version_0", cli


@pytest.mark.slow
def test_config_yaml_holds_the_chosen_sizes_and_the_model_was_built_with_them(chosen_run):
    run, cli = chosen_run
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["data"]["max_length"] == cli.datamodule.max_length == cli.model.network.max_length == 56
    assert saved["data"]["vocab_size"] == cli.datamodule.vocab_size == cli.model.network.vocab_size == 34
    assert saved["early_stopping"]["monitor"] == "val/acc"


@pytest.mark.slow
def test_rerun_from_config_yaml_scores_the_best_checkpoint_as_training_did(chosen_run, tmp_path):
    run, cli = chosen_run
    best = resolve_checkpoint(run)
    assert best.name.startswith("best-")
    logged = torch.load(best, weights_only=True)["callbacks"]
    score = next(float(s["best_model_score"]) for k, s in logged.items() if "ModelCheckpoint" in k)
    again = train.main(["validate", "--config", str(run / "config.yaml"), "--ckpt_path", str(best), *QUIET,
                        "--trainer.logger", "false", "--trainer.default_root_dir", str(tmp_path)])
    assert float(again.trainer.callback_metrics["val/acc"]) == pytest.approx(score, abs=1e-6)


def test_ensemble_averages_the_probabilities_of_its_checkpoints(chosen_run):
    run, _ = chosen_run
    paths = [resolve_checkpoint(run), run / "checkpoints" / "last.ckpt"]
    texts = ["alpha w3 beta w7", "beta w1 w2 alpha w9 w4", "w1 beta w2 w3 alpha"]
    single = [TextClassifier.from_checkpoint(p, device="cpu").predict(texts) for p in paths]
    averaged = Ensemble.from_checkpoints(paths, device="cpu").predict(texts)
    for i, prediction in enumerate(averaged):
        for name, p in prediction.probabilities.items():
            assert p == pytest.approx((single[0][i].probabilities[name] + single[1][i].probabilities[name]) / 2)
        assert prediction.label == max(prediction.probabilities, key=prediction.probabilities.get)
    assert math.isclose(sum(averaged[0].probabilities.values()), 1.0, rel_tol=1e-6)


def test_predict_py_takes_several_checkpoints_and_run_folders(chosen_run, capsys):
    # predict.main in this process (tests/test_predict.py runs predict.py as a real process)
    run, _ = chosen_run
    last = run / "checkpoints" / "last.ckpt"
    assert predict.main(["--ckpt", str(run), "--ckpt", str(last), "alpha w3 beta"]) == 0
    expected = Ensemble.from_checkpoints([run, last], device="cpu").predict(["alpha w3 beta"])[0]
    out = json.loads(capsys.readouterr().out)
    assert out["label"] == expected.label
    assert out["probabilities"] == pytest.approx(expected.probabilities, abs=1e-6)
    with pytest.raises(SystemExit) as refused:  # argparse's error: usage and the reason on stderr, exit code 2
        predict.main(["--ckpt", str(run), "--ckpt", str(last), "--attention", "alpha"])
    assert refused.value.code == 2 and "take one --ckpt" in capsys.readouterr().err


@pytest.mark.slow
def test_accuracy_bench_scores_a_run_by_its_best_checkpoint_and_keeps_its_validation_curve(chosen_run):
    from bench.accuracy import ensemble_accuracy, score_run

    run, _ = chosen_run
    best = resolve_checkpoint(run)
    logged = torch.load(best, weights_only=True)["callbacks"]
    score = next(float(s["best_model_score"]) for k, s in logged.items() if "ModelCheckpoint" in k)
    scored = score_run(run, "validation")
    assert scored["checkpoint"] == str(best) and scored["epochs"] == 2
    assert scored["accuracy"] == pytest.approx(score, abs=1e-6) == scored["best_val"] >= scored["last_val"]
    splits = load_splits(dataset="synthetic", data_dir=None, train_file=None, val_file=None, test_file=None,
                         text_column=None, label_column=None, val_fraction=0.1, seed=0)
    # The same checkpoint twice averages to itself: the ensemble scores what train.py validated.
    assert ensemble_accuracy([str(best), str(best)], splits, "validation") == pytest.approx(score, abs=1e-6)
