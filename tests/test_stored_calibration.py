"""A checkpoint's stored calibration is checked where it is read (data/checkpoint.py's stored_calibration), so every
face refuses a broken one in one line; checkpoints combined agree on labels and layout; several labels a text show
their thresholds (predict.py --show-thresholds, serve's /info)."""

import json
import math

import pytest
import torch

import export
import predict
from conftest import save_checkpoint, tiny_classifier
from data.checkpoint import CheckpointError, read_checkpoint
from inference import TextClassifier
from inference.answers import model_info, prediction_outputs
from inference.ensemble import Ensemble


def checkpoint_with(tmp_path, name="c.ckpt", multi_label=False, calibration=None, labels=("neg", "pos")):
    """A tiny checkpoint in train.py's layout with this calibration entry (None: none stored)."""
    classifier = tiny_classifier()
    classifier.label_names = list(labels)
    path = save_checkpoint(classifier, tmp_path / name)
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"]["multi_label"] = multi_label
    if calibration is not None:
        checkpoint["calibration"] = calibration
    torch.save(checkpoint, path)
    return path


BROKEN = [
    ({"temperature": math.inf, "thresholds": []}, "'temperature' is inf"),
    ({"temperature": math.nan, "thresholds": []}, "'temperature' is nan"),
    ({"temperature": 0.0, "thresholds": []}, "'temperature' is 0.0"),
    ({"temperature": -2.0, "thresholds": []}, "'temperature' is -2.0"),
    ({"temperature": 1e6, "thresholds": []}, "'temperature' is 1000000.0"),
    ({"temperature": "2", "thresholds": []}, "'temperature' is '2'"),
    ({"temperature": 1.0, "thresholds": [1.5, -0.2]}, "label 'neg' is 1.5"),
    ({"temperature": 1.0, "thresholds": [0.5, math.nan]}, "label 'pos' is nan"),
    ({"temperature": 1.0, "thresholds": ["0.5", "0.5"]}, "label 'neg' is '0.5'"),
    ({"temperature": 1.0, "thresholds": [0.5]}, "one number in [0, 1] per label (2 labels)"),
    ({"temperature": 1.0, "thresholds": "0.5"}, "'thresholds' is '0.5'"),
    ("warm", "'calibration' is 'warm'"),
]


@pytest.mark.parametrize("calibration, said", BROKEN, ids=[said for _, said in BROKEN])
def test_a_broken_stored_calibration_is_one_line_naming_the_file_the_field_and_the_value(tmp_path, calibration, said):
    path = checkpoint_with(tmp_path, multi_label=True, calibration=calibration)
    with pytest.raises(CheckpointError) as stop:
        TextClassifier.from_checkpoint(path, device="cpu")
    message = str(stop.value)
    assert str(path) in message and said in message and "\n" not in message
    with pytest.raises(CheckpointError):  # every face reads a checkpoint through here (diagnose, serve, export, ...)
        read_checkpoint(path)


def test_the_temperature_bound_is_said_and_a_stored_one_inside_it_is_used(tmp_path):
    with pytest.raises(CheckpointError, match=r"finite number in \[0.01, 100\]"):
        TextClassifier.from_checkpoint(checkpoint_with(tmp_path, calibration={"temperature": 500.0}), device="cpu")
    classifier = TextClassifier.from_checkpoint(
        checkpoint_with(tmp_path, "ok.ckpt", calibration={"temperature": 2, "thresholds": []}), device="cpu")
    assert classifier.temperature == 2.0 and classifier.thresholds == [0.5, 0.5]


@pytest.mark.parametrize("face", ["predict", "export"])
@pytest.mark.parametrize("calibration, said", [
    ({"temperature": 1.0, "thresholds": [1.5, -0.2]}, "calibration 'thresholds' of label 'neg' is 1.5"),
    ({"temperature": math.nan, "thresholds": [0.5, 0.5]}, "calibration 'temperature' is nan"),
])
def test_the_faces_refuse_it_with_exit_status_2_and_write_nothing(tmp_path, capsys, face, calibration, said):
    path = checkpoint_with(tmp_path, multi_label=True, calibration=calibration)
    out = tmp_path / "onnx"
    code = predict.main(["--ckpt", str(path), "alpha"]) if face == "predict" else \
        export.main(["--ckpt", str(path), "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert captured.err.count("\n") == 1 and said in captured.err
    assert not out.exists()


def test_resuming_or_testing_reads_the_same_checked_calibration(tmp_path):
    from training.module import ClassifierModule

    module = ClassifierModule.__new__(ClassifierModule)
    with pytest.raises(CheckpointError, match="'temperature' is nan"):
        module.on_load_checkpoint({"hyper_parameters": {"label_names": ["a", "b"]},
                                   "calibration": {"temperature": math.nan, "thresholds": []}})
    module.on_load_checkpoint({"hyper_parameters": {"label_names": ["a", "b"]},
                               "calibration": {"temperature": 1.5, "thresholds": [0.25, 0.75]}})
    assert module.temperature == 1.5 and module.thresholds == [0.25, 0.75]


# ---- checkpoints combined -------------------------------------------------------------------------------------------


def test_an_ensemble_of_one_label_and_several_labels_checkpoints_is_refused_in_one_line(tmp_path, capsys):
    several = checkpoint_with(tmp_path, "ml.ckpt", multi_label=True, labels=("billing", "urgent"))
    one = checkpoint_with(tmp_path, "sl.ckpt", multi_label=False, labels=("billing", "urgent"))
    for first, second in ((several, one), (one, several)):
        code = predict.main(["--ckpt", str(first), "--ckpt", str(second), "alpha"])
        captured = capsys.readouterr()
        assert code == 2 and captured.out == "" and captured.err.count("\n") == 1
        assert str(second) in captured.err and "one label a text (softmax)" in captured.err \
            and "several labels a text" in captured.err
        with pytest.raises(CheckpointError, match="differs from"):
            model_info([first, second])  # serve.py: before any worker starts
    members = [TextClassifier.from_checkpoint(p, device="cpu") for p in (several, one)]
    with pytest.raises(CheckpointError, match="checkpoint 1: one label a text"):
        Ensemble(members)


def test_an_ensemble_of_other_label_names_is_refused(tmp_path):
    a = checkpoint_with(tmp_path, "a.ckpt", labels=("neg", "pos"))
    b = checkpoint_with(tmp_path, "b.ckpt", labels=("pos", "neg"))
    with pytest.raises(CheckpointError, match=r"labels \['pos', 'neg'\] differ from the labels \['neg', 'pos'\]"):
        Ensemble.from_checkpoints([a, b], device="cpu")


# ---- several labels: the thresholds shown -----------------------------------------------------------------------------


def test_predict_shows_the_thresholds_it_used_and_info_lists_them(tmp_path, capsys):
    a = checkpoint_with(tmp_path, "a.ckpt", multi_label=True, calibration={"temperature": 1.0, "thresholds": [0.2, 0.6]})
    b = checkpoint_with(tmp_path, "b.ckpt", multi_label=True, calibration={"temperature": 1.0, "thresholds": [0.4, 0.8]})
    assert predict.main(["--ckpt", str(a), "--show-thresholds", "alpha w1", "beta"]) == 0
    answers = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    for answer in answers:
        assert answer["thresholds"] == {"neg": 0.2, "pos": 0.6}
        assert answer["labels"] == sorted((n for n, p in answer["probabilities"].items()
                                           if p >= answer["thresholds"][n]), key=lambda n: -answer["probabilities"][n])
    assert predict.main(["--ckpt", str(a), "alpha w1"]) == 0
    assert "thresholds" not in json.loads(capsys.readouterr().out)  # asked for only
    ensemble = Ensemble.from_checkpoints([a, b], device="cpu")
    (out, _), = prediction_outputs(ensemble, ["alpha"], thresholds=True)
    assert out["thresholds"] == pytest.approx({"neg": 0.3, "pos": 0.7})
    info = model_info([a, b])
    assert info["multi_label"] and info["thresholds"] == pytest.approx({"neg": 0.3, "pos": 0.7})
    assert [m["thresholds"] for m in info["checkpoints"]] == [{"neg": 0.2, "pos": 0.6}, {"neg": 0.4, "pos": 0.8}]


def test_show_thresholds_on_a_one_label_model_is_one_line(tmp_path, capsys):
    path = checkpoint_with(tmp_path)
    assert predict.main(["--ckpt", str(path), "--show-thresholds", "alpha"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "has no thresholds" in captured.err and captured.err.count("\n") == 1
    assert model_info([path])["thresholds"] is None


@pytest.mark.parametrize("settings", [{"temperature": math.nan}, {"temperature": math.inf}, {"temperature": 0.0},
                                      {"thresholds": [0.5, 1.5]}, {"thresholds": [math.nan, 0.5]}, {"thresholds": [0.5]}])
def test_the_api_constructor_takes_the_same_rule(settings):
    classifier = tiny_classifier()
    with pytest.raises(ValueError, match=r"need one threshold in \[0, 1\] a label and a temperature in \[0.01, 100\]"):
        TextClassifier(classifier.model, classifier.tokenizer, ["neg", "pos"], device="cpu", multi_label=True,
                       **settings)


def test_a_seeded_fuzzer_over_stored_calibration_finds_no_other_error():
    """10,000 drawn calibration entries: each is read (and then within the rule) or refused with CheckpointError,
    never another exception."""
    import random

    from data.checkpoint import TEMPERATURE_RANGE, stored_calibration

    rng = random.Random(0)
    odd = [math.nan, math.inf, -math.inf, -1, 0, 0.5, 1, 1.5, 1e300, True, None, "0.5", b"1", [], {}, [0.5], (0.2,),
           torch.tensor(0.5), torch.tensor([0.5, 0.5])]

    def value():
        return rng.choice(odd) if rng.random() < 0.5 else rng.uniform(-2, 200)

    read = 0
    for _ in range(10_000):
        labels = ["a", "b", "c"][: rng.randint(1, 3)]
        entry = rng.choice([value(), {"temperature": value(), "thresholds": value()},
                            {"temperature": value(), "thresholds": [value() for _ in range(rng.randint(0, 4))]}])
        try:
            temperature, thresholds = stored_calibration({"hyper_parameters": {"label_names": labels},
                                                          "calibration": entry})
        except CheckpointError as e:
            assert "\n" not in str(e)
            continue
        read += 1
        assert TEMPERATURE_RANGE[0] <= temperature <= TEMPERATURE_RANGE[1]
        assert thresholds is None or (len(thresholds) == len(labels) and all(0 <= c <= 1 for c in thresholds))
    assert read > 100  # the draws also reach valid entries
