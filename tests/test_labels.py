"""Labels as users have them: the layouts of several labels a text, unknown and empty label sets, class weights and
the monitored metric, thresholds and temperature fitted, stored and applied by predict, the ONNX export and serve."""

import json
import logging

import numpy as np
import pytest
import torch

from conftest import QUIET, SMOKE, save_checkpoint, tiny_classifier
from data import labels
from data.sources import DataError, load_splits
from training import calibration

ROWS = [("happy glad", ["joy"]), ("angry mad", ["anger"]), ("scared afraid", ["fear"]),
        ("angry scared", ["anger", "fear"]), ("glad but afraid", ["fear", "joy"]), ("mad and happy", ["joy", "anger"])]


def splits_of(train, validation=None, **settings):
    return load_splits(dataset="sst2", data_dir=None, train_file=str(train), val_file=validation and str(validation),
                       test_file=None, text_column="text", label_column=settings.pop("label_column", "labels"),
                       val_fraction=0.1, seed=0, **settings)


def write_lists(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if path.suffix == ".parquet":
        pq.write_table(pa.table({"text": [t for t, _ in rows], "labels": [s for _, s in rows]}), path)
    else:
        path.write_text("".join(json.dumps({"text": t, "labels": s}) + "\n" for t, s in rows))
    return path


def as_names(splits, split="train"):
    return [sorted(splits.label_names[c] for c in s) for s in splits.labels[split]]


@pytest.mark.parametrize("layout", ["parquet", "jsonl", "delimited", "columns"])
def test_each_layout_gives_the_same_label_sets(tmp_path, layout):
    rows = ROWS * 3
    if layout in ("parquet", "jsonl"):
        path, settings = write_lists(tmp_path / f"t.{layout}", rows), {}
    elif layout == "delimited":  # "fear,anger" and "anger,fear" are one set, not two classes
        path = tmp_path / "t.csv"
        path.write_text("text,labels\n" + "".join(f'{t},"{",".join(s)}"\n' for t, s in rows))
        settings = {"label_separator": ","}
    else:
        path = tmp_path / "t.csv"
        names = ["anger", "fear", "joy"]
        path.write_text("text," + ",".join(names) + "\n" + "".join(
            t + "," + ",".join(str(int(n in s)) for n in names) + "\n" for t, s in rows))
        settings = {"label_column": names}
    splits = splits_of(path, **settings)
    assert splits.multi_label and splits.label_names == ["anger", "fear", "joy"]
    texts = list(splits.texts["train"]) + list(splits.texts["validation"])
    sets = as_names(splits) + as_names(splits, "validation")
    assert sorted(zip(texts, map(tuple, sets))) == sorted((t, tuple(sorted(s))) for t, s in rows)


def test_a_label_never_seen_in_training_is_dropped_and_a_text_of_only_unknown_labels_skipped(tmp_path, caplog):
    train = write_lists(tmp_path / "train.jsonl", ROWS)
    validation = write_lists(tmp_path / "val.jsonl", [("glad", ["joy", "surprise"]), ("what", ["surprise"]),
                                                      ("mad", ["anger"])])
    with caplog.at_level(logging.WARNING):
        splits = splits_of(train, validation)
    assert list(splits.texts["validation"]) == ["glad", "mad"]
    assert as_names(splits, "validation") == [["joy"], ["anger"]]
    assert "surprise" in caplog.text and "1 text(s) left with no known label skipped" in caplog.text


def test_an_empty_set_is_a_text_no_label_applies_to_but_an_empty_cell_has_no_label(tmp_path, caplog):
    splits = splits_of(write_lists(tmp_path / "t.jsonl", ROWS + [("nothing here", [])]), tmp_path / "t.jsonl")
    assert [] in splits.labels["train"] and "nothing here" in splits.texts["train"]
    path = tmp_path / "t.csv"
    path.write_text("text,labels\n" + "".join(f'{t},"{",".join(s)}"\n' for t, s in ROWS) + "blank,\n")
    with caplog.at_level(logging.WARNING):
        splits = splits_of(path, path, label_separator=",")
    assert "blank" not in splits.texts["train"] and "1 rows with an empty or missing label" in caplog.text


def test_a_set_column_of_one_label_a_text_is_single_label(tmp_path):
    splits = splits_of(write_lists(tmp_path / "t.jsonl", [(t, s[:1]) for t, s in ROWS] * 2))
    assert not splits.multi_label and all(isinstance(label, int) for label in splits.labels["train"])


def test_bad_label_layouts_are_one_line_errors(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("text,joy,fear\nhappy,1,0\nscared,0,yes\n")
    with pytest.raises(DataError, match=r"t.csv: column 'fear', row 2: 'yes' is not 0 or 1"):
        splits_of(path, label_column=["joy", "fear"])
    with pytest.raises(DataError, match="every label set is empty"):
        splits_of(write_lists(tmp_path / "e.jsonl", [("a", []), ("b", [])]))


def test_the_hub_layout_indexes_the_registered_names():
    encoded, names, keep = labels.encode_sets({"train": [[27], [2, 14]], "test": [[3]]}, {"train": "t", "test": "s"},
                                              ["n%d" % i for i in range(28)])
    assert names[27] == "n27" and encoded == {"train": [[27], [2, 14]], "test": [[3]]} and keep["test"] == [0]


def test_imbalance_chooses_weights_and_the_monitored_metric():
    counts = torch.tensor([900.0, 100.0])
    assert labels.is_imbalanced(counts, multi_label=False) and labels.monitored_metric(True) == "val/f1"
    assert not labels.is_imbalanced(torch.tensor([550.0, 450.0]), multi_label=False)
    weights = labels.balanced_weights(counts, 1000, multi_label=False)
    assert torch.allclose(weights * counts, torch.full((2,), 500.0))  # each class weighs the same in the loss
    assert torch.allclose(labels.balanced_weights(counts, 1000, multi_label=True), torch.tensor([100 / 900, 9.0]))


def test_temperature_scaling_recovers_the_temperature_that_made_the_labels():
    torch.manual_seed(0)
    logits = torch.randn(4000, 3) * 4
    drawn = torch.multinomial((logits / 2.0).softmax(-1), 1).squeeze(-1)  # labels as sure as logits / 2
    assert calibration.fit_temperature(logits, drawn) == pytest.approx(2.0, rel=0.1)
    before = calibration.expected_calibration_error(logits.softmax(-1), drawn, False)
    after = calibration.expected_calibration_error((logits / 2.0).softmax(-1), drawn, False)
    assert after < 0.03 < before


def test_the_reliability_figure_takes_a_confidence_of_exactly_one():
    # A model that has learned its task answers some texts with probability 1.0 in float32.
    probabilities = torch.tensor([[0.0, 1.0], [0.4, 0.6], [0.5, 0.5], [0.01, 0.99]])
    figure = calibration.reliability_figure(probabilities, torch.tensor([1, 1, 0, 1]), False, "t")
    heights = [bar.get_height() for bar in figure.axes[0].patches]
    assert len(heights) == calibration.ECE_BINS and heights[-1] == 1.0  # 0.99 and 1.0: the last bin, both right


def test_thresholds_maximise_each_labels_f1():
    probabilities = torch.tensor([[0.30, 0.9], [0.25, 0.8], [0.10, 0.2], [0.05, 0.7]])
    truth = torch.tensor([[1, 1], [1, 1], [0, 0], [0, 0]])
    cuts = calibration.fit_thresholds(probabilities, truth)
    assert 0.10 < cuts[0] <= 0.25 and 0.70 < cuts[1] <= 0.80  # both labels' F1 1 with these cuts, 0.5 misses label 0
    figures = calibration.scores(probabilities, truth, True, cuts)
    assert figures["f1"] == 1.0 and figures["acc"] == 1.0


def test_a_threshold_is_the_middle_of_the_tied_best_cuts():
    # Every cut from 0.21 to 0.80 separates these texts (F1 1); the middle stays clear of both sides, where the
    # lowest would answer yes to a new text at 0.22, a hair surer than the negative at 0.20.
    probabilities = torch.tensor([[0.90, 0.6], [0.80, 0.2], [0.20, 0.9], [0.10, 0.1]])
    truth = torch.tensor([[1, 0], [1, 0], [0, 1], [0, 0]])
    cuts = calibration.fit_thresholds(probabilities, truth)
    assert cuts[0] == pytest.approx((0.21 + 0.80) / 2, abs=0.006)
    assert cuts[1] == pytest.approx((0.61 + 0.90) / 2, abs=0.006)  # above the negative at 0.6, up to the positive


def calibrated_checkpoint(tmp_path, multi_label: bool):
    classifier = tiny_classifier()
    path = save_checkpoint(classifier, tmp_path / "c.ckpt")
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"]["multi_label"] = multi_label
    checkpoint["calibration"] = {"temperature": 1.0 if multi_label else 3.0,
                                 "thresholds": [0.4, 0.6] if multi_label else []}
    torch.save(checkpoint, path)
    return classifier, path


@pytest.mark.parametrize("multi_label", [False, True])
def test_calibration_is_stored_and_applied_by_predict_and_the_onnx_export(tmp_path, multi_label):
    import onnxruntime

    import export
    from inference import TextClassifier

    original, path = calibrated_checkpoint(tmp_path, multi_label)
    classifier = TextClassifier.from_checkpoint(path, device="cpu")
    texts = ["alpha w1 beta w2", "w3 beta alpha", "好 差 w4"]
    with torch.no_grad():
        ids, _, _ = classifier.encode(texts)
        logits = torch.cat([original.model(torch.tensor([i])).logits for i in ids])
    expected = logits.sigmoid() if multi_label else (logits / 3.0).softmax(-1)
    predictions = classifier.predict(texts)
    got = torch.tensor([list(p.probabilities.values()) for p in predictions])
    assert torch.allclose(got, expected, atol=1e-5)
    if multi_label:  # the labels reaching their own threshold (0.4, 0.6), most probable first
        for p, row in zip(predictions, expected.tolist()):
            chosen = [n for n, q, cut in zip(["neg", "pos"], row, [0.4, 0.6]) if q >= cut]
            assert p.labels == sorted(chosen, key=lambda n: -p.probabilities[n]) and p.to_dict()["labels"] == p.labels
    assert export.main(["--ckpt", str(path), "--out", str(tmp_path / "onnx")]) == 0
    config = json.loads((tmp_path / "onnx" / "config.json").read_text())
    assert config["multi_label"] is multi_label and config["temperature"] == (1.0 if multi_label else 3.0)
    assert config["thresholds"] == ([0.4, 0.6] if multi_label else None)
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"))
    width = max(map(len, ids))
    feed = {"input_ids": np.array([i + [0] * (width - len(i)) for i in ids], dtype=np.int64),
            "attention_mask": np.array([[1] * len(i) + [0] * (width - len(i)) for i in ids], dtype=np.int64)}
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    np.testing.assert_allclose(outputs["probabilities"], expected.numpy(), atol=1e-4)


def test_a_checkpoint_without_calibration_keeps_softmax_and_half_cuts(tmp_path):
    from inference import TextClassifier

    path = save_checkpoint(tiny_classifier(), tmp_path / "old.ckpt")  # written before calibration existed
    classifier = TextClassifier.from_checkpoint(path, device="cpu")
    assert classifier.temperature == 1.0 and not classifier.multi_label


def test_served_answers_carry_the_label_set(tmp_path):
    from inference import TextClassifier
    from inference.answers import prediction_outputs

    _, path = calibrated_checkpoint(tmp_path, multi_label=True)
    classifier = TextClassifier.from_checkpoint(path, device="cpu")
    (out, prediction), = prediction_outputs(classifier, ["alpha w1 beta"])
    assert out["labels"] == prediction.labels and set(out["probabilities"]) == {"neg", "pos"}
    assert out["label"] == ", ".join(prediction.labels)


@pytest.mark.slow
def test_multi_label_trains_and_its_thresholds_are_stored_and_reloaded(tmp_path):
    import train
    from inference import TextClassifier

    rows = []
    rng = np.random.default_rng(0)
    words = {"joy": "happy", "anger": "angry", "fear": "scared"}
    for _ in range(240):
        chosen = [n for n in words if rng.random() < 0.4]
        rows.append((" ".join([words[n] for n in chosen] + [f"w{rng.integers(20)}" for _ in range(4)]), chosen))
    data = write_lists(tmp_path / "train.parquet", rows)
    cli = train.main(["fit", "--config", SMOKE, "--data.train_file", str(data), "--data.label_column", "labels",
                      "--data.cache_dir", str(tmp_path / "cache"), "--trainer.logger.init_args.save_dir", str(tmp_path),
                      "--trainer.max_epochs", "3", *QUIET])
    assert cli.model.hparams.multi_label and cli.trainer.callbacks  # sigmoid head and BCE from the data
    config = (tmp_path / "lightning_logs" / "version_0" / "config.yaml").read_text()
    assert "monitor: val/f1" in config
    (best,) = (tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("best-*f1*.ckpt")
    checkpoint = torch.load(best, weights_only=True)
    thresholds = checkpoint["calibration"]["thresholds"]
    assert len(thresholds) == 3 and all(0 < cut < 1 for cut in thresholds)
    classifier = TextClassifier.from_checkpoint(best, device="cpu")
    assert classifier.multi_label and classifier.thresholds == thresholds
    explanation, = classifier.explain(["happy angry w1"], ig_steps=4)
    assert explanation.per_label and explanation.label == next(iter(explanation.per_label))


def test_the_balanced_sampler_fills_the_batches_with_each_class_about_equally():
    from data.batches import BucketBatchSampler, balanced_draws

    classes = torch.tensor([0] * 900 + [1] * 100)
    lengths = [1 + i % 7 for i in range(len(classes))]

    def rare_share(sampler):
        drawn = [i for batch in sampler.batches() for i in batch]
        assert len(drawn) == len(classes)  # an epoch is as many texts as the split, whichever the draws
        return float(classes[drawn].float().mean())

    plain = BucketBatchSampler(lengths, 32, shuffle=True, seed=0, pool_batches=1)
    balanced = BucketBatchSampler(lengths, 32, shuffle=True, seed=0, pool_batches=1,
                                  weights=balanced_draws(classes, 2))
    assert rare_share(plain) == pytest.approx(0.1)
    assert rare_share(balanced) == pytest.approx(0.5, abs=0.05)
    first = balanced.batches()
    balanced.epoch += 1
    assert balanced.batches() != first  # fresh draws each epoch
    unshuffled = BucketBatchSampler(lengths, 32, shuffle=False, weights=balanced_draws(classes, 2))
    assert sorted(i for batch in unshuffled.batches() for i in batch) == list(range(1000))  # validation: each once


def balanced_or_not(tmp_path, negatives, **settings):
    from data import TextDataModule

    rows = [("bad film", 0)] * negatives + [("good film", 1)] * 10
    train = tmp_path / f"train{negatives}.csv"
    train.write_text("text,label\n" + "".join(f"{t},{c}\n" for t, c in rows))
    return TextDataModule(train_file=str(train), val_file=str(train), tokenizer="word",
                          cache_dir=str(tmp_path / "cache"), **settings)


@pytest.mark.parametrize("negatives, shifted", [(30, True), (29, False), (10, False)])
def test_the_teacher_is_balanced_and_shifted_only_when_the_commonest_class_is_3_times_the_rarest(
        tmp_path, caplog, negatives, shifted):
    caplog.set_level(logging.INFO, logger="training.ngram_teacher")
    from training.teacher import attach_teacher

    data = balanced_or_not(tmp_path, negatives, teacher="ngram")
    attach_teacher(data)
    assert data.split("train").teacher_probs.shape == (negatives + 10, 2)
    assert ("class-balanced offsets" in caplog.text) is shifted
    assert data.balanced_sampler is False  # off unless asked for


def loss_weights_under(data, class_weights):
    from training.class_weights import choose_loss_weights

    return choose_loss_weights(class_weights, False, data, ["0", "1"], "cpu")


def test_the_balanced_sampler_and_class_weights_never_both_balance_the_classes(tmp_path):
    from model.config import ConfigError

    sampled, unsampled = balanced_or_not(tmp_path, 90, balanced_sampler=True), balanced_or_not(tmp_path, 90)
    assert loss_weights_under(sampled, "auto") is None  # the draws balance the classes: the loss stays unweighted
    assert loss_weights_under(unsampled, "balanced").tolist() == pytest.approx([100 / 180, 100 / 20])
    with pytest.raises(ConfigError, match="both balance the classes"):
        loss_weights_under(sampled, "balanced")


def test_the_balanced_teachers_out_of_fold_probabilities_are_shifted_to_even_recalls():
    from training.ngram_teacher import balanced_out_of_fold

    torch.manual_seed(0)
    classes = torch.tensor([0] * 900 + [1] * 100)
    score = torch.randn(1000) + (2 * classes - 1)  # each class ±1 away from 0, so the balanced cut is 0
    for shift in (-2.0, 0.0):  # a teacher too sure of the commonest class (as out of fold on a rare one), or not
        logits = torch.stack([torch.zeros(1000), 2 * score + shift], 1)
        shifted = balanced_out_of_fold(logits.softmax(-1), classes)
        recalls = [float((shifted.argmax(1) == c)[classes == c].float().mean()) for c in (0, 1)]
        assert recalls == pytest.approx([0.84, 0.84], abs=0.06)  # Φ(1) each, whatever the shift
        assert torch.allclose(shifted.sum(1), torch.ones(1000))
    before = float((logits.softmax(-1).argmax(1) == 1)[classes == 1].float().mean())
    assert before == pytest.approx(recalls[1], abs=0.06)  # unbiased already: next to nothing moves


def test_the_balanced_sampler_is_refused_for_several_labels_a_text(tmp_path):
    from data import TextDataModule

    data = TextDataModule(train_file=str(write_lists(tmp_path / "train.jsonl", ROWS * 3)), text_column="text",
                          label_column="labels", balanced_sampler=True, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(DataError, match="balanced_sampler needs one label a text"):
        data.train_dataloader()
