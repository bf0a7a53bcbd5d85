"""Distillation from an n-gram teacher: out-of-fold teacher probabilities (training/ngram_teacher.py), fitted by the
training side's teacher step and cached as an entry of their own (training/teacher.py), carried in the training
batches, and the loss that mixes them with the labels (training/module.py)."""

import logging
import random

import pytest
import torch
import torch.nn.functional as F

import train
from conftest import ROOT, fit, rows, write
import training.teacher
from data.datamodule import TextDataModule
from data.sources import DataError
from model.config import NetworkConfig
from training.module import ClassifierModule
from training.ngram_teacher import is_cjk, out_of_fold_probabilities
from training.teacher import attach_teacher


def test_teacher_learns_words_that_carry_the_label():
    rng = random.Random(0)
    texts, labels = [], []
    for _ in range(300):
        label = rng.randrange(3)
        filler = " ".join(f"w{rng.randrange(50)}" for _ in range(6))
        texts.append(f"{filler} {['red', 'green', 'blue'][label]} {filler}")
        labels.append(label)
    probabilities = out_of_fold_probabilities(texts, labels, num_classes=3)
    assert probabilities.shape == (300, 3) and probabilities.dtype == torch.float32
    assert torch.allclose(probabilities.sum(1), torch.ones(300), atol=1e-5)
    # Columns are class ids: the column of each text's own colour holds the most probability.
    assert (probabilities.argmax(1) == torch.tensor(labels)).float().mean() > 0.95


def test_teacher_probabilities_are_out_of_fold():
    # Each text is one word of its own and its label is a coin flip: a teacher that had seen a text would
    # recall its label (in-sample agreement near 100%); one that had not can only guess (about 50%).
    rng = random.Random(1)
    texts = [f"word{i} word{i}x" for i in range(400)]
    labels = [rng.randrange(2) for _ in texts]
    probabilities = out_of_fold_probabilities(texts, labels, num_classes=2)
    agreement = (probabilities.argmax(1) == torch.tensor(labels)).float().mean().item()
    assert 0.35 < agreement < 0.65

    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    x = TfidfVectorizer().fit_transform(texts)
    in_sample = (LogisticRegression(C=4.0).fit(x, labels).predict(x) == labels).mean()
    assert in_sample > 0.95  # the same teacher scoring its own training texts


@pytest.mark.slow
def test_the_several_labels_teacher_learns_each_labels_word_out_of_fold():
    # Each label has its word; a text carries 0-2 labels. Enough texts that the parallel label fits get the n-gram
    # matrix memory-mapped, read-only (joblib does so above 1 MB).
    rng = random.Random(0)
    texts, sets = [], []
    for _ in range(3000):
        labels = sorted(rng.sample(range(3), rng.randrange(3)))
        filler = " ".join(f"w{rng.randrange(2000)}" for _ in range(30))
        texts.append(f"{filler} {' '.join(['red', 'green', 'blue'][c] for c in labels)}")
        sets.append(labels)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # two label fits at a time
    try:
        probabilities = out_of_fold_probabilities(texts, sets, num_classes=3)
    finally:
        torch.set_num_threads(threads)
    truth = torch.zeros(3000, 3)
    for row, labels in enumerate(sets):
        truth[row, labels] = 1
    assert probabilities.shape == (3000, 3)
    assert ((probabilities >= 0.5) == truth.bool()).float().mean() > 0.95  # each column its label's probability


def test_a_class_with_one_text_still_gets_a_teacher():
    texts = ["good film", "great film", "fine film", "bad film", "lovely film", "nice film"]
    probabilities = out_of_fold_probabilities(texts, [1, 1, 1, 0, 1, 1], num_classes=2)
    assert probabilities.shape == (6, 2) and torch.allclose(probabilities.sum(1), torch.ones(6))


def test_a_label_on_every_text_gets_teacher_probability_one():
    # "billing" on every text, "urgent" on half, "bug" on none: the constant labels are answered by their constant.
    texts = [f"word{i} common extra{i % 3}" for i in range(12)]
    sets = [[0] + ([1] if i % 2 else []) for i in range(12)]
    probabilities = out_of_fold_probabilities(texts, sets, num_classes=3)
    assert torch.equal(probabilities[:, 0], torch.ones(12)) and torch.equal(probabilities[:, 2], torch.zeros(12))
    assert ((probabilities[:, 1] > 0) & (probabilities[:, 1] < 1)).all()  # the one label learned


def test_one_label_on_every_text_is_no_traceback():
    probabilities = out_of_fold_probabilities([f"word{i} common" for i in range(12)], [[0]] * 12, num_classes=2)
    assert torch.equal(probabilities, torch.tensor([[1.0, 0.0]]).expand(12, 2))


def test_fewer_training_texts_than_folds_several_labels(caplog):
    texts = ["a red one", "a red blue one", "a blue one", "red again"]
    with caplog.at_level(logging.INFO, logger="training.ngram_teacher"):
        probabilities = out_of_fold_probabilities(texts, [[0], [0, 1], [1], [0]], num_classes=2)
    assert probabilities.shape == (4, 2) and ((probabilities >= 0) & (probabilities <= 1)).all()
    assert "4 folds for 4 training texts" in caplog.text


def test_a_single_training_text_gets_the_labels_shares():
    probabilities = out_of_fold_probabilities(["red and blue"], [[0, 2]], num_classes=3)
    assert torch.equal(probabilities, torch.tensor([[1.0, 0.0, 1.0]]))


def test_cjk_texts_are_read_as_characters():
    assert is_cjk(["房间很干净，服务也好", "早餐差"]) and not is_cjk(["a great film", "boring"])


def test_training_batches_carry_the_teacher_and_its_own_cache_entry_keeps_it(tmp_path, monkeypatch):
    path = write(tmp_path / "t.csv", rows(8))
    kwargs = dict(train_file=str(path), vocab_size=100, batch_size=8, cache_dir=str(tmp_path / "cache"), teacher="ngram")
    data = TextDataModule(**kwargs)
    assert data.split("train").teacher_probs is None  # the data build fits no teacher
    attach_teacher(data)
    train = data.split("train")
    assert train.teacher_probs.shape == (len(train), 2)
    batch = next(iter(data.train_dataloader()))
    assert batch["teacher_probs"].shape == (len(batch["labels"]), 2)
    assert "teacher_probs" not in next(iter(data.val_dataloader()))  # validation is scored on labels only
    assert len(list((tmp_path / "cache").glob("t-teacher-*.pt"))) == 1  # an entry of its own beside the data's

    def no_refit(*args, **kwargs):
        raise AssertionError("the teacher was fitted again")

    monkeypatch.setattr(training.teacher, "out_of_fold_probabilities", no_refit)
    for changed in ({}, {"vocab_size": 50, "max_length": 16}):  # the same texts read: the teacher's entry is reused
        again = TextDataModule(**(kwargs | changed))
        attach_teacher(again)
        assert torch.equal(again.split("train").teacher_probs, train.teacher_probs)
    plain = TextDataModule(**(kwargs | {"teacher": None}))
    attach_teacher(plain)
    assert plain.split("train").teacher_probs is None
    assert plain.cache_path() == data.cache_path()  # the encoded data do not depend on the teacher


def test_soft_targets_of_the_wrong_shape_are_refused(tmp_path):
    data = TextDataModule(train_file=str(write(tmp_path / "t.csv", rows(8))), vocab_size=100,
                          cache_dir=str(tmp_path / "cache"))
    n = len(data.split("train"))
    with pytest.raises(DataError, match=rf"the teacher's probabilities have shape \({n + 1}, 2\), the training split "
                                        rf"needs \({n}, 2\)"):
        data.attach_soft_targets(torch.full((n + 1, 2), 0.5))


def test_unknown_teacher_is_refused(tmp_path):
    from data.sources import DataError

    with pytest.raises(DataError, match="teacher must be ngram or null, got 'bert'"):
        TextDataModule(train_file=str(tmp_path / "t.csv"), teacher="bert")


def distillation_loss(alpha, teacher_probs):
    torch.manual_seed(0)
    module = ClassifierModule(NetworkConfig(vocab_size=20, num_classes=2, max_length=8, d_model=8, n_heads=2),
                              distillation=alpha)
    module.log = module.log_dict = lambda *a, **k: None  # no trainer attached
    module.eval()  # no dropout: both computations below see the same network
    batch = {"input_ids": torch.randint(2, 20, (4, 8)), "padding_mask": torch.zeros(4, 8, dtype=torch.bool),
             "labels": torch.tensor([0, 1, 1, 0]), "teacher_probs": teacher_probs}
    logits = module.model(batch["input_ids"], batch["padding_mask"]).logits
    return module.training_step(batch, 0), logits, batch


def test_distillation_loss_mixes_labels_and_teacher():
    teacher = torch.tensor([[0.9, 0.1], [0.3, 0.7], [0.5, 0.5], [0.2, 0.8]])
    loss, logits, batch = distillation_loss(0.25, teacher)
    hard = F.cross_entropy(logits, batch["labels"])
    soft = -(teacher * logits.log_softmax(-1)).sum(-1).mean()
    assert torch.allclose(loss, 0.75 * hard + 0.25 * soft, atol=1e-6)
    assert not torch.allclose(loss, hard, atol=1e-3)  # the teacher changed the loss


def test_distillation_without_teacher_probabilities_is_an_error():
    module = ClassifierModule(NetworkConfig(vocab_size=20, num_classes=2, max_length=8, d_model=8, n_heads=2),
                              distillation=0.5)
    batch = {"input_ids": torch.randint(2, 20, (2, 8)), "padding_mask": torch.zeros(2, 8, dtype=torch.bool),
             "labels": torch.tensor([0, 1])}
    with pytest.raises(ValueError, match="set data.teacher ngram"):
        module.training_step(batch, 0)
    with pytest.raises(ValueError, match="distillation must be between 0 and 1"):
        ClassifierModule(distillation=1.5)


@pytest.mark.slow
def test_train_py_refuses_distillation_without_a_teacher(tmp_path, capfd):
    # train.main's own exits, in this process: the one line a real process prints (test_training.py shows in a real
    # process that a refused setting prints that line and no traceback).
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--model.distillation", "0.5")
    assert "model.distillation 0.5 needs a teacher: set data.teacher ngram" in str(stop.value.code)
    with pytest.raises(SystemExit) as stop:
        fit(tmp_path, "--data.teacher", "ngram", "--model.distillation", "1.5")
    assert str(stop.value.code) == "error: model.distillation must be between 0 and 1, got 1.5"
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.slow
def test_smoke_run_with_a_teacher_trains(tmp_path):
    cli = fit(tmp_path, "--data.teacher", "ngram", "--model.distillation", "0.5", "--trainer.max_epochs", "1",
              "--trainer.limit_train_batches", "5", "--trainer.limit_val_batches", "2")
    assert cli.trainer.global_step > 0
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])


@pytest.mark.slow
def test_the_generic_default_distills_on_a_users_own_file(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="training.ngram_teacher")
    path = write(tmp_path / "reviews.csv", rows(6), text="review", label="stars")
    train.main(["fit", "--config", str(ROOT / "configs" / "default.yaml"), "--data.train_file", str(path),
                "--data.text_column", "review", "--data.label_column", "stars", "--data.cache_dir",
                str(tmp_path / "cache"), "--trainer.default_root_dir", str(tmp_path), "--trainer.max_epochs", "1",
                "--trainer.enable_progress_bar", "false"])
    assert "n-gram teacher: out-of-fold probabilities for" in caplog.text
    config = (next(tmp_path.glob("lightning_logs/version_*")) / "config.yaml").read_text()
    assert "teacher: ngram" in config and "distillation: 0.5" in config
