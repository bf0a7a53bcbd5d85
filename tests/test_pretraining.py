"""Pretraining on unlabeled text: the objectives on tiny known cases, the pretraining data, `train.py pretrain`,
the hand-over to `train.py fit --model.init_from`, and the bad inputs."""

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import train
from conftest import ONE_PROBE, QUIET, ROOT
from data import TextDataModule
from data.pretraining import PretrainDataModule
from data.sources import DataError
from data.tokenizer import FIRST_WORD_ID, MASK_ID, stored_form
from inference import TextClassifier
from model.config import NetworkConfig
from model.kinds import ATTENTION_KINDS
from model.pretraining import PretrainingNetwork, choose, corrupt
from training.encoder import ENCODER_PARTS, encoder_state
from training.starting import StartOfFit

IDS = dict(mask_id=MASK_ID, first_word_id=FIRST_WORD_ID)  # the tokenizer's, as training/pretraining.py passes them
TINY = ["--model.network.d_model", "16", "--model.network.n_heads", "2", "--model.network.d_ff", "16"]


def tiny_network(**overrides) -> NetworkConfig:
    settings = dict(vocab_size=12, max_length=16, d_model=16, n_heads=2, d_ff=16, dropout=0.0, embedding_dropout=0.0,
                    window=2, projection_length=4, global_tokens=1)
    return NetworkConfig(**settings | overrides)


def write_lines(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def labelled_files(tmp_path: Path) -> dict[str, Path]:
    """train/validation/test CSVs whose texts are told apart by their first word."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = {}
    for split, n in (("train", 60), ("validation", 10), ("test", 10)):
        rows = ["text,label"] + [f"{split}{i} good fine movie {i % 7},{i % 2}" for i in range(n)]
        files[split] = write_lines(tmp_path / f"{split}.csv", rows)
    return files


def pretrain(tmp_path, *extra, files=None):
    files = files or labelled_files(tmp_path)
    args = ["pretrain", "--data.train_file", str(files["train"]), "--data.val_file", str(files["validation"]),
            "--data.test_file", str(files["test"]), "--data.cache_dir", str(tmp_path / "cache"),
            "--data.batch_size", "8", "--trainer.max_epochs", "1", "--trainer.logger.init_args.save_dir",
            str(tmp_path / "pretrain"), *TINY, *QUIET, *ONE_PROBE, *extra]
    return train.main(args)


def fine_tune(tmp_path, checkpoint, *extra, files=None):
    files = files or labelled_files(tmp_path)
    args = ["fit", "--data.teacher", "null", "--model.distillation", "0", "--data.train_file", str(files["train"]),
            "--data.val_file", str(files["validation"]),
            "--data.cache_dir", str(tmp_path / "cache"), "--model.init_from", str(checkpoint),
            "--trainer.max_epochs", "1", "--trainer.logger.init_args.save_dir", str(tmp_path / "fit"),
            *TINY, *QUIET, *ONE_PROBE, *extra]
    return train.main(args)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("pretrain")
    cli = pretrain(tmp_path)
    return tmp_path, cli, tmp_path / "pretrain" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


@pytest.fixture(scope="module")
def fine_tuned(pretrained, tmp_path_factory) -> Path:
    """The classifier checkpoint of one fine-tuning run from `pretrained` (read it, never change it)."""
    tmp_path = tmp_path_factory.mktemp("fine_tuned")
    fine_tune(tmp_path, pretrained[2])
    return tmp_path / "fit" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"


# ---- the objectives -----------------------------------------------------------------------------------------------

def test_masking_picks_only_real_known_tokens_and_at_least_one_per_text():
    ids = torch.tensor([[5, 6, 7, 8, 0, 0], [MASK_ID, 9, 0, 0, 0, 0], [4, 4, 4, 4, 4, 4]])
    padding = ids == 0
    for seed in range(20):
        chosen = choose(ids, padding, 0.15, torch.Generator().manual_seed(seed), first_word_id=FIRST_WORD_ID)
        assert not (chosen & padding).any() and not (chosen & (ids == MASK_ID)).any()
        assert chosen.any(dim=1).all()  # every text has something to predict
        assert chosen[1].tolist() == [False, True, False, False, False, False]  # its only known token


def test_masked_objective_predicts_the_chosen_places_only_with_the_original_ids():
    torch.manual_seed(0)
    ids = torch.randint(FIRST_WORD_ID, 12, (4, 10))
    padding = torch.zeros_like(ids, dtype=torch.bool)
    padding[1, 6:] = True
    ids[padding] = 0
    corruption = corrupt("masked", ids, padding, 0.3, 12, torch.Generator().manual_seed(1), **IDS)
    assert torch.equal(corruption.targets, ids[corruption.chosen])
    assert torch.equal(corruption.input_ids[~corruption.chosen], ids[~corruption.chosen])  # the rest is untouched
    network = PretrainingNetwork(tiny_network(), "masked")
    loss, correct, output = network.loss(corruption, padding)
    assert output.logits.shape == (int(corruption.chosen.sum()), 12) == (len(correct), 12)
    # The same loss from every real token's logits, read at the chosen places only.
    every = network(corruption.input_ids, padding).logits  # (N, V)
    at_chosen = every[corruption.chosen[~padding]]
    torch.testing.assert_close(loss, F.cross_entropy(at_chosen, corruption.targets))


def test_token_head_is_tied_to_the_embedding():
    network = PretrainingNetwork(tiny_network(), "masked")
    shapes = [tuple(p.shape) for name, p in network.named_parameters() if name != "token_embedding.weight"]
    assert (12, 16) not in shapes  # no second (V, D) matrix: the head's weight is the embedding table
    ids = torch.tensor([[3, 4, 5, 6]])
    before = network(ids).logits
    with torch.no_grad():
        network.token_embedding.weight[7] += 1.0  # token 7 is not in the text: only the head can see the change
    after = network(ids).logits
    assert torch.equal(before[:, :7], after[:, :7]) and not torch.equal(before[:, 7], after[:, 7])


def test_replaced_objective_marks_exactly_the_swapped_tokens():
    ids = torch.randint(FIRST_WORD_ID, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    padding = torch.zeros_like(ids, dtype=torch.bool)
    padding[2, 8:] = True
    corruption = corrupt("replaced", ids, padding, 0.3, 50, torch.Generator().manual_seed(2), **IDS)
    changed = corruption.input_ids != ids
    assert torch.equal(corruption.chosen, changed) and changed.any()
    assert torch.equal(corruption.targets, changed[~padding].float())
    assert not changed[padding].any()


@pytest.mark.slow
@pytest.mark.parametrize("objective", ["masked", "replaced"])
def test_the_loss_goes_down_on_a_repetitive_text(objective):
    torch.manual_seed(0)
    network = PretrainingNetwork(tiny_network(vocab_size=8, max_length=12), objective)
    ids = torch.tensor([[2, 3, 4, 5, 6, 7] * 2] * 16)  # one pattern: every masked token follows from its neighbours
    padding = torch.zeros_like(ids, dtype=torch.bool)
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-2)
    losses = []
    for step in range(150):
        loss, correct, _ = network.loss(corrupt(objective, ids, padding, 0.2, 8, **IDS), padding)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    network.eval()
    _, correct, _ = network.loss(corrupt(objective, ids, padding, 0.2, 8, torch.Generator().manual_seed(9), **IDS), padding)
    assert sum(losses[-10:]) < 0.2 * sum(losses[:10])
    assert correct.mean() > 0.9


@pytest.mark.parametrize("attention", list(ATTENTION_KINDS))
@pytest.mark.parametrize("objective", ["masked", "replaced"])
def test_every_attention_kind_takes_a_pretraining_step(attention, objective):
    network = PretrainingNetwork(tiny_network(attention=attention), objective)
    ids = torch.randint(FIRST_WORD_ID, 12, (3, 9))
    padding = torch.zeros_like(ids, dtype=torch.bool)
    padding[0, 5:] = True
    loss, _, output = network.loss(corrupt(objective, ids, padding, 0.15, 12, **IDS), padding, need_weights=True)
    loss.backward()
    assert torch.isfinite(loss) and len(output.attention) == 1
    assert network.blocks[0].attention.w_q.weight.grad.abs().sum() > 0


# ---- the pretraining text -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_pretraining_text_is_train_plus_unlabeled_never_validation_or_test(tmp_path):
    files = labelled_files(tmp_path)
    unlabeled = write_lines(tmp_path / "more.txt", ["extra one text", "validation3 good fine movie 3",
                                                    "test4 good fine movie 4", "extra two text"])
    data = PretrainDataModule(train_file=str(files["train"]), val_file=str(files["validation"]),
                              test_file=str(files["test"]), unlabeled_files=[str(unlabeled)], tokenizer="word",
                              cache_dir=str(tmp_path / "cache"))
    texts, counts = data.pretraining_texts()
    assert sorted(texts) == sorted([f"train{i} good fine movie {i % 7}" for i in range(60)]
                                   + ["extra one text", "extra two text"])
    assert list(counts.values()) == [60, 2]
    words = set(data.tokenizer.get_vocab())
    assert "extra" in words and not any(w.startswith(("validation", "test")) for w in words)


def test_a_carved_validation_split_is_left_out_of_pretraining(tmp_path):
    files = labelled_files(tmp_path)
    data = PretrainDataModule(train_file=str(files["train"]), val_fraction=0.2, cache_dir=str(tmp_path / "cache"))
    fit_data = TextDataModule(train_file=str(files["train"]), val_fraction=0.2, cache_dir=str(tmp_path / "cache"))
    splits = fit_data.read_splits()
    texts, _ = data.pretraining_texts()
    assert sorted(texts) == sorted(splits.texts["train"]) and not set(texts) & set(splits.texts["validation"])


def test_pretraining_takes_the_data_arguments_of_fit_from_one_place():
    import inspect

    from jsonargparse import ArgumentParser

    from data.datamodule import TextDataModule

    def options(cls) -> set[str]:  # the data.* flags LightningCLI offers for the class
        parser = ArgumentParser()
        parser.add_class_arguments(cls, "data")
        return set(parser.get_defaults().as_dict()["data"])

    own = {"unlabeled_files", "unlabeled_column", "holdout_fraction"}
    assert options(PretrainDataModule) == options(TextDataModule) - {"teacher", "tokenizer_from"} | own
    # written once: the pretraining DataModule names only its own arguments and hands the rest on
    assert set(inspect.signature(PretrainDataModule.__init__).parameters) == {"self", *own, "data"}


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet", ".txt"])
def test_unlabeled_files_of_every_format_are_read(tmp_path, suffix):
    import pandas as pd

    frame = pd.DataFrame({"text": ["one text here", "another text", " "]})
    path = tmp_path / f"more{suffix}"
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True, force_ascii=False)
    elif suffix == ".parquet":
        frame.to_parquet(path)
    else:
        write_lines(path, list(frame.text))
    from data.reading import read_unlabeled

    assert read_unlabeled(path) == ["one text here", "another text"]


# ---- train.py pretrain, the hand-over, resume -----------------------------------------------------------------------

@pytest.mark.slow
def test_pretrain_logs_loss_accuracy_attention_and_writes_checkpoints(pretrained):
    tmp_path, cli, last = pretrained
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert last.exists() and list(last.parent.glob("best-*.ckpt"))
    events = EventAccumulator(str(last.parent.parent), size_guidance={"scalars": 0, "images": 0})
    events.Reload()
    tags = events.Tags()
    for tag in ("val/loss", "val/acc", "train/acc", "attention_health/distance/layer0_head0",
                "attention_health/entropy/layer0_head1"):
        assert tag in tags["scalars"], tag
    assert "attention/probe_0" in tags["images"]
    checkpoint = torch.load(last, weights_only=True)
    assert checkpoint["hyper_parameters"]["objective"] == "masked"


@pytest.mark.slow
def test_fine_tuning_starts_from_exactly_the_pretrained_weights_and_tokenizer(pretrained, tmp_path):
    _, _, last = pretrained
    files = labelled_files(tmp_path)
    args = ["--data.train_file", str(files["train"]), "--data.val_file", str(files["validation"]),
            "--data.cache_dir", str(tmp_path / "cache"), "--model.init_from", str(last),
            "--trainer.logger.init_args.save_dir", str(tmp_path), *TINY, *QUIET]
    cli = train.cli(args, run=False)
    checkpoint = torch.load(last, weights_only=True)
    assert stored_form(cli.datamodule.state["tokenizer"]) == checkpoint["PretrainDataModule"]["tokenizer"]
    assert cli.model.network.vocab_size == checkpoint["hyper_parameters"]["network"]["vocab_size"]
    StartOfFit().setup(cli.trainer, cli.model, "fit")  # what a fit does before it restores a --ckpt_path
    own = cli.model.model.state_dict()
    shared = encoder_state(checkpoint)
    assert shared and set(shared) == {name for name in own if name.startswith(ENCODER_PARTS)}
    for name, tensor in shared.items():
        assert torch.equal(own[name], tensor), name


@pytest.mark.slow
def test_fine_tuned_checkpoint_is_self_contained(pretrained, fine_tuned):
    _, _, last = pretrained
    checkpoint = fine_tuned
    classifier = TextClassifier.from_checkpoint(checkpoint)
    prediction = classifier.predict(["train3 good fine movie 3"], attention=True)[0]
    assert prediction.label in ("0", "1") and prediction.attention is not None
    saved = torch.load(checkpoint, weights_only=True)["TextDataModule"]["tokenizer"]
    # the same tokenizer (a classifier checkpoint stores it without truncation: max_length is the network's)
    assert saved == stored_form(torch.load(last, weights_only=True)["PretrainDataModule"]["tokenizer"])


@pytest.mark.slow
def test_pretraining_resumes_from_last(tmp_path):
    short = ["--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1"]
    steps = pretrain(tmp_path, *short).trainer.global_step
    resumed = pretrain(tmp_path, *short, "--ckpt_path", "last", "--trainer.max_epochs", "2")
    assert resumed.trainer.global_step == 2 * steps
    assert resumed.trainer.logger.version == "version_0"  # the same run, continued


# ---- bad input: one line, nothing lost ----------------------------------------------------------------------------

def run_error(capsys, function, *args, **kwargs) -> str:
    with pytest.raises(SystemExit) as stop:
        function(*args, **kwargs)
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def test_fine_tuning_from_a_classifier_checkpoint_is_one_line(fine_tuned, tmp_path, capsys):
    message = run_error(capsys, fine_tune, tmp_path / "second", fine_tuned)
    assert "a classifier checkpoint, not a pretraining one" in message
    assert not (tmp_path / "second" / "fit").exists()  # nothing written


@pytest.mark.slow
def test_fine_tuning_from_a_file_that_is_no_checkpoint_is_one_line(tmp_path, capsys):
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    assert "not a checkpoint written by train.py" in run_error(capsys, fine_tune, tmp_path, junk)
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}}, other)
    assert "not a pretraining checkpoint of this project" in run_error(capsys, fine_tune, tmp_path, other)


def test_fine_tuning_with_another_network_shape_is_one_line(pretrained, tmp_path, capsys):
    _, _, last = pretrained
    message = run_error(capsys, fine_tune, tmp_path, last, "--model.network.n_layers", "2")
    assert "pretrained with n_layers 1 (this config: 2)" in message
    assert not (tmp_path / "fit").exists()


def test_fine_tuning_without_the_pretrained_embedding_norm_is_one_line(pretrained, tmp_path, capsys):
    _, cli, last = pretrained
    assert cli.model.network.embedding_norm  # configs/pretrain.yaml, as configs/default.yaml
    message = run_error(capsys, fine_tune, tmp_path, last, "--model.network.embedding_norm", "false")
    assert "pretrained with embedding_norm True (this config: False)" in message
    assert not (tmp_path / "fit").exists()


def test_fine_tuning_with_another_vocabulary_is_one_line(pretrained, tmp_path, capsys):
    _, _, last = pretrained
    message = run_error(capsys, fine_tune, tmp_path, last, "--data.vocab_size", "5000")
    assert "data.vocab_size 5000 differs from the pretraining checkpoint" in message


def test_resuming_pretraining_from_a_classifier_checkpoint_is_one_line(fine_tuned, tmp_path, capsys):
    message = run_error(capsys, pretrain, tmp_path, "--ckpt_path", str(fine_tuned))
    # the flag that was given, and where this file belongs; not --model.init_from, which was not given
    assert f"--ckpt_path {fine_tuned}: a classifier checkpoint" in message and "init_from" not in message
    assert f"train.py fit --ckpt_path {fine_tuned}" in message
    assert not (tmp_path / "pretrain").exists()


def chinese_files(tmp_path: Path) -> dict[str, Path]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    reviews = ["这家酒店很好", "房间太小了", "服务很热情", "早餐不好吃"]
    return {split: write_lines(tmp_path / f"{split}.csv", ["text,label"] + [f"{reviews[i % 4]},{i % 2}"
                                                                            for i in range(n)])
            for split, n in (("train", 40), ("validation", 8))}


def test_fine_tuning_texts_unknown_to_the_pretrained_tokenizer_is_refused_before_training(pretrained, tmp_path,
                                                                                          capsys):
    _, _, last = pretrained  # pretrained on English texts: every Chinese character is [UNK] to its tokenizer
    message = run_error(capsys, fine_tune, tmp_path, last, files=chinese_files(tmp_path / "zh"))
    assert f"100% of the training tokens are [UNK] to the tokenizer of the pretraining checkpoint {last}" in message
    assert "fine-tune without model.init_from" in message
    assert not (tmp_path / "fit").exists()  # refused before anything was written


def test_a_minority_of_unknown_tokens_is_a_warning_with_the_share(caplog):
    from data.datamodule import EncodedSplit
    from data.pretraining import check_known
    from data.tokenizer import UNK_ID

    def split(ids):
        return EncodedSplit(torch.tensor(ids, dtype=torch.int32), torch.tensor([0, len(ids)]), torch.tensor([0]))

    with caplog.at_level("WARNING", logger="data.pretraining"):
        assert check_known(split([5, 6, 7, 8, 9, 10, 11, 12, 13, UNK_ID]), "p.ckpt") == pytest.approx(0.1)
        assert not caplog.records  # a tenth unknown: as a fresh tokenizer's rare words, no warning
        assert check_known(split([5, 6, 7, UNK_ID]), "p.ckpt") == pytest.approx(0.25)
    assert "25% of the training tokens are [UNK]" in caplog.text and "p.ckpt" in caplog.text
    with pytest.raises(DataError, match="75% of the training tokens"):
        check_known(split([5, UNK_ID, UNK_ID, UNK_ID]), "p.ckpt")


@pytest.mark.slow
@pytest.mark.parametrize("content, expected", [
    (b"", "no rows"),
    (b"text\n", "no rows"),
    (b'text\n" "\n', "no non-empty texts"),
    (b"\xff\xfe broken", "not valid UTF-8"),
])
def test_an_empty_or_unreadable_unlabeled_file_is_one_line(tmp_path, capsys, content, expected):
    bad = tmp_path / "more.csv"
    bad.write_bytes(content)
    message = run_error(capsys, pretrain, tmp_path, "--data.unlabeled_files", json.dumps([str(bad)]))
    assert str(bad) in message and expected in message
    assert not (tmp_path / "pretrain").exists()


@pytest.mark.slow
def test_a_damaged_parquet_and_a_missing_file_are_one_line(tmp_path, capsys):
    bad = tmp_path / "more.parquet"
    bad.write_bytes(b"PAR1 not really parquet")
    assert str(bad) in run_error(capsys, pretrain, tmp_path, "--data.unlabeled_files", json.dumps([str(bad)]))
    missing = tmp_path / "nowhere.txt"
    assert "file not found" in run_error(capsys, pretrain, tmp_path, "--data.unlabeled_files",
                                         json.dumps([str(missing)]))


@pytest.mark.slow
def test_texts_too_short_to_mask_are_one_line(tmp_path, capsys):
    files = {}
    for split in ("train", "validation", "test"):
        rows = ["text,label"] + [f"{split}{i},{i % 2}" for i in range(20)]  # one word each
        files[split] = write_lines(tmp_path / f"{split}.csv", rows)
    message = run_error(capsys, pretrain, tmp_path, files=files)
    assert "texts too short to mask" in message


def test_word_vector_baseline_is_a_deterministic_checkpoint_fine_tuning_starts_from(tmp_path, monkeypatch):
    import training.word_vectors
    from bench.pretraining import word_vector_checkpoint
    from data.checkpoint import read_pretraining_checkpoint
    from model.classifier import AttentionClassifier
    from training.encoder import load_encoder

    made, real = [], training.word_vectors.skipgram_vectors
    monkeypatch.setattr(training.word_vectors, "skipgram_vectors",
                        lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    files = labelled_files(tmp_path)
    args = ["--data.train_file", str(files["train"]), "--data.val_file", str(files["validation"]),
            "--data.cache_dir", str(tmp_path / "cache"), *TINY]
    word_vector_checkpoint(args, tmp_path / "a" / "word_vectors.ckpt")
    word_vector_checkpoint(args, tmp_path / "b" / "word_vectors.ckpt")
    checkpoint = read_pretraining_checkpoint(tmp_path / "a" / "word_vectors.ckpt")
    table = checkpoint["state_dict"]["model.token_embedding.weight"]
    # the same data and seed: the same vectors, bit for bit
    assert torch.equal(table, torch.load(tmp_path / "b" / "word_vectors.ckpt", weights_only=True)["state_dict"][
        "model.token_embedding.weight"])
    network = NetworkConfig.from_dict(checkpoint["hyper_parameters"]["network"])
    # the skip-gram vectors, at the spread the network's own embedding starts with (not at their own)
    assert len(made) == 2 and torch.allclose(table, made[0] / made[0].std() * network.embedding_std)
    assert abs(float(table.std()) - network.embedding_std) < 1e-4
    classifier = AttentionClassifier(network)
    load_encoder(classifier, str(tmp_path / "a" / "word_vectors.ckpt"))
    assert table.shape[1] == 16 and torch.equal(classifier.token_embedding.weight, table)


@pytest.mark.slow
def test_pretraining_is_given_the_network_of_the_fine_tuning_configs(tmp_path):
    from bench.pretraining import network_args
    from training.encoder import ENCODER_SETTINGS

    fit = ["--config", "configs/imdb.yaml", "--config", "configs/imdb_local.yaml", "--model.network.n_heads", "2"]
    common = ["--data.dataset", "synthetic", "--data.cache_dir", str(tmp_path), "--trainer.logger", "false"]
    tuned = train.cli([*(str(ROOT / a) if a.endswith(".yaml") else a for a in fit), *common], run=False)
    pretrain = ["pretrain", "--config", str(ROOT / "configs" / "pretrain.yaml"), *network_args(fit), *common]
    pretrained = train.cli(pretrain, run=False)
    for name in (*ENCODER_SETTINGS, "embedding_std"):  # what the hand-over checks, and the vectors' spread
        assert getattr(pretrained.model.network, name) == getattr(tuned.model.network, name), name
    assert pretrained.model.network.d_model == 64 and pretrained.model.network.n_heads == 2
    assert network_args([]) == []  # no config: the generic default, whose network pretrain.yaml already is


def test_the_reproduction_fails_in_one_line_that_says_what_to_do(tmp_path, monkeypatch):
    import sys

    from bench.pretraining import reproduce, run

    monkeypatch.setenv("ATTENTION_DATA_ROOT", str(tmp_path))  # no imdb/unsup.parquet there
    with pytest.raises(SystemExit) as stop:
        reproduce("imdb", 0, tmp_path / "runs", None, [])
    message = str(stop.value.code)
    assert message == (f"error: {tmp_path}/imdb/unsup.parquet: file not found; the imdb recipe reads its unlabeled "
                       "texts there: set ATTENTION_DATA_ROOT to the folder that holds imdb/unsup.parquet")
    assert not (tmp_path / "runs").exists()
    # a run that fails with train.py's one line: that line, and the command, not the whole log
    with pytest.raises(SystemExit) as stop:
        run([sys.executable, "-c", "import sys; print('log', file=sys.stderr); sys.exit('error: data.x: bad')"], None)
    assert str(stop.value.code).startswith("error: data.x: bad (from: ") and "\n" not in str(stop.value.code)


def test_help_of_pretrain_is_pretrains_and_the_main_help_lists_it(capsys):
    with pytest.raises(SystemExit) as stop:
        train.cli(["pretrain", "--help"])
    out = capsys.readouterr().out
    assert stop.value.code == 0 and "pretrain the network on unlabeled text" in out.split("options:")[0]
    with pytest.raises(SystemExit):
        train.cli(["--help"])
    assert "train.py pretrain" in capsys.readouterr().out


def test_the_encoding_log_of_pretraining_names_no_labels_and_a_classifiers_does(tmp_path, caplog):
    files = labelled_files(tmp_path)
    with caplog.at_level("INFO", logger="data"):
        PretrainDataModule(train_file=str(files["train"]), tokenizer="word", cache_dir=str(tmp_path / "p")).state
    (pretraining,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("encoded")]
    caplog.clear()
    with caplog.at_level("INFO", logger="data"):
        TextDataModule(train_file=str(files["train"]), tokenizer="word", cache_dir=str(tmp_path / "c")).state
    (classifier,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("encoded")]
    assert "labels" not in pretraining and "labels [" in classifier
