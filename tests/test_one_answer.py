"""One model, one answer: the same text gets the same calibrated probabilities from predict's API and command line,
--explain and its HTML page, serve's answers (in-process) and the ONNX export; docs/SERVING.md's onnxruntime example
is run and prints what predict.py prints."""

import contextlib
import io
import json
import re

import pytest
import torch

import export
import predict
from conftest import ROOT, save_checkpoint, tiny_classifier
from inference import TextClassifier
from inference.answers import answer_batch
from inference.request import PredictRequest

TEXTS = ["alpha w1 beta w2 alpha", "w3 beta", "a charming and affecting journey"]
TEMPERATURE = 3.0  # far from 1, so a face that leaves it out gives other probabilities


def calibrated_checkpoint(folder, multi_label: bool):
    path = save_checkpoint(tiny_classifier(), folder / "c.ckpt")
    checkpoint = torch.load(path, weights_only=True)
    checkpoint["hyper_parameters"]["multi_label"] = multi_label
    checkpoint["calibration"] = {"temperature": 1.0 if multi_label else TEMPERATURE,
                                 "thresholds": [0.45, 0.55] if multi_label else []}
    torch.save(checkpoint, path)
    return path


@pytest.fixture(scope="module", params=[False, True], ids=["one label", "several labels"])
def exported(request, tmp_path_factory):
    """(checkpoint, its export folder "exported", multi_label): one export per layout, shared by the tests here."""
    folder = tmp_path_factory.mktemp("one-answer")
    path = calibrated_checkpoint(folder, request.param)
    assert export.main(["--ckpt", str(path), "--out", str(folder / "exported")]) == 0
    return path, folder / "exported", request.param


def printed(capsys, *args) -> list[dict]:
    assert predict.main([str(arg) for arg in args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def page_data(path) -> dict:
    """The JSON the explanation page carries (inference/templates/page.html's data script)."""
    return json.loads(re.search(r'id="data">(.*?)</script>', path.read_text(encoding="utf-8"), re.S).group(1))


def test_every_face_gives_the_same_calibrated_probabilities(tmp_path, capsys, exported):
    import numpy as np
    import onnxruntime

    path, folder, multi_label = exported
    classifier = TextClassifier.from_checkpoint(path, device="cpu")
    with torch.no_grad():
        ids, _, _ = classifier.encode(TEXTS)
        logits = torch.cat([classifier.model(torch.tensor([i])).logits for i in ids])
    expected = logits.sigmoid() if multi_label else (logits / TEMPERATURE).softmax(-1)
    names = classifier.label_names

    faces = {"api": [p.probabilities for p in classifier.predict(TEXTS)],
             "predict.py": [o["probabilities"] for o in printed(capsys, "--ckpt", path, *TEXTS)]}
    html = tmp_path / "page.html"
    faces["--explain"] = [o["probabilities"] for o in printed(capsys, "--ckpt", path, "--explain", "--html", html,
                                                               *TEXTS)]
    faces["--explain page"] = [card["probabilities"] for card in page_data(html)["texts"]]
    (served,), (served_explained,) = [answer_batch(classifier, [PredictRequest(texts=TEXTS, explain=explain)])
                                      for explain in (False, True)]
    faces["serve"] = [o["probabilities"] for o in served["predictions"]]
    faces["serve explain"] = [o["probabilities"] for o in served_explained["predictions"]]
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"))
    for i, text_ids in enumerate(ids):  # one text a run: no padding to describe
        feed = {"input_ids": np.array([text_ids], dtype=np.int64),
                "attention_mask": np.ones((1, len(text_ids)), dtype=np.int64)}
        outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
        faces.setdefault("onnx", []).append(dict(zip(names, outputs["probabilities"][0].tolist())))
    for face, answers in faces.items():
        got = torch.tensor([[answer[name] for name in names] for answer in answers], dtype=torch.float64)
        assert torch.allclose(got, expected.double(), atol=1e-5), face


def test_export_writes_strict_json(exported):
    _, folder, multi_label = exported
    text = (folder / "config.json").read_text(encoding="utf-8")
    config = json.loads(text, parse_constant=lambda name: pytest.fail(f"config.json holds {name}, not JSON"))
    assert config["temperature"] == (1.0 if multi_label else TEMPERATURE)
    assert config["thresholds"] == ([0.45, 0.55] if multi_label else None)


def test_the_serving_docs_onnx_example_prints_what_predict_prints(capsys, monkeypatch, exported):
    pytest.importorskip("onnxruntime")
    section = (ROOT / "docs" / "SERVING.md").read_text(encoding="utf-8").split("## export.py", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    texts = json.loads(re.search(r"^texts = (\[.*?\])", code, re.M).group(1))
    path, folder, _ = exported
    monkeypatch.chdir(folder.parent)  # the example reads exported/
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "docs/SERVING.md", "exec"), {})
    example = [json.loads(line) for line in out.getvalue().splitlines()]
    expected = printed(capsys, "--ckpt", path, *texts)
    assert [o["label"] for o in example] == [o["label"] for o in expected]
    assert [o.get("labels") for o in example] == [o.get("labels") for o in expected]
    for mine, theirs in zip(example, expected):
        assert mine["probabilities"] == pytest.approx(theirs["probabilities"], abs=1e-5)
