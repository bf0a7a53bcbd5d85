"""export.py: for every attention kind, onnxruntime on the files in DIR alone (model.onnx, tokenizer.json,
config.json) gives PyTorch's probabilities and attention weights within 1e-4, on a padded batch of another size and
length than the export's trace; bad targets and failed exports are one-line errors."""

import json

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from tokenizers import Tokenizer

import export
from conftest import REGISTERED_KINDS, registry_with_plugged_in, save_checkpoint, tiny_classifier

pytestmark = pytest.mark.slow  # torch.export and ONNX conversion: ~10-30 s per kind on 2 cores
TOLERANCE = 1e-4
# 5 texts of 1 to 9 tokens (max_length is 12, the trace 3 × 12): padding in every row but the longest; 好 and 差 are
# in the tokenizer's vocabulary, "[PAD]" typed in a text is a real token, "zzz" an unknown word.
TEXTS = ["w1 alpha w2 beta w3 w4 w5 w6 w7", "beta 好 差", "alpha", "w3 [PAD] w4 zzz", "w8 w9 w10 w11 w12 w13"]


@pytest.fixture(scope="module", params=REGISTERED_KINDS)
def exported(request, tmp_path_factory):
    """Each kind of the registry, and the plugged-in one (tests/test_kinds.py), exported."""
    kind = request.param
    folder = tmp_path_factory.mktemp(f"export_{kind}")
    with registry_with_plugged_in():
        # Two layers for full attention (the stack in the graph); one for the other kinds, which add their own
        # formula and not another stack (tracing a second layer costs about a third more).
        classifier = tiny_classifier(kind, n_layers=2 if kind == "full" else 1)
        ckpt = save_checkpoint(classifier, folder / "tiny.ckpt")
        assert export.main(["--ckpt", str(ckpt), "--out", str(folder / "out"), "--attention"]) == 0
        yield kind, classifier, folder / "out"


def run_onnx(out, texts):
    """What a user does with DIR alone: tokenize with tokenizer.json, feed model.onnx, read config.json."""
    tokenizer = Tokenizer.from_file(str(out / "tokenizer.json"))
    config = json.loads((out / "config.json").read_text())
    encodings = tokenizer.encode_batch(texts)
    feed = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64)}
    session = onnxruntime.InferenceSession(str(out / "model.onnx"))
    outputs = dict(zip([o.name for o in session.get_outputs()], session.run(None, feed)))
    return config, encodings, feed, outputs


def test_onnxruntime_gives_pytorchs_probabilities_and_weights(exported):
    kind, classifier, out = exported
    config, encodings, feed, outputs = run_onnx(out, TEXTS)
    assert feed["input_ids"].shape == (5, 9)  # neither the trace's batch (3) nor its length (12)
    predictions = classifier.predict(TEXTS, attention=True)
    ids, _, _ = classifier.encode(TEXTS)
    probabilities = torch.tensor(outputs["logits"]).softmax(-1).numpy()
    layers = classifier.model.config.n_layers
    for row, (prediction, encoding) in enumerate(zip(predictions, encodings)):
        n = len(ids[row])
        assert encoding.ids[:n] == ids[row] and sum(encoding.attention_mask) == n  # the project's ids, its padding
        expected = [prediction.probabilities[name] for name in config["labels"]]
        assert np.abs(probabilities[row] - expected).max() < TOLERANCE
        assert config["labels"][int(probabilities[row].argmax())] == prediction.label
        for layer in range(layers):
            weights = outputs[f"attention.{layer}"][row, :, :n]  # (H, n, L or K)
            tokens = prediction.attention_keys is None  # columns are the L tokens, not a long kind's K keys
            weights = weights[..., :n] if tokens else weights
            assert np.abs(weights - prediction.attention[layer].numpy()).max() < TOLERANCE
            if tokens:  # padded keys get exactly 0 from every real query
                assert not outputs[f"attention.{layer}"][row, :, :n, n:].any()
        if prediction.attention_keys is not None:
            assert (outputs["attention_keys"][:n] == prediction.attention_keys.numpy()).all()
        if prediction.global_attention is not None:
            g = prediction.global_attention.shape[-2]
            for layer in range(layers):
                got = outputs[f"global_attention.{layer}"][row, :, :g, :n]
                assert np.abs(got - prediction.global_attention[layer].numpy()).max() < TOLERANCE


def test_a_single_text_and_a_longer_batch_run_too(exported):
    kind, classifier, out = exported
    for texts in (["alpha w1 beta"], TEXTS + ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14"]):  # 1 × 3, 6 × 12
        _, _, feed, outputs = run_onnx(out, texts)
        assert outputs["logits"].shape == (len(texts), 2)
        expected = [list(p.probabilities.values()) for p in classifier.predict(texts)]
        assert np.abs(torch.tensor(outputs["logits"]).softmax(-1).numpy() - expected).max() < TOLERANCE


def test_the_graph_holds_the_written_formula_and_the_config_says_how_to_use_it(exported):
    kind, classifier, out = exported
    graph = onnx.load(str(out / "model.onnx")).graph
    ops = {node.op_type for node in graph.node}
    assert {"MatMul", "Softmax"} <= ops and not any("Attention" in op for op in ops)
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask"]
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.INT64 for i in graph.input)
    config = json.loads((out / "config.json").read_text())
    assert config["labels"] == ["neg", "pos"] and config["attention"] == kind and config["max_length"] == 12
    assert config["padding"]["side"] == "right" and config["padding"]["pad_id"] == 0
    assert set(config["outputs"]) == {o.name for o in graph.output}


def test_without_attention_there_is_one_output(tmp_path):
    # one layer (half the tracing), with the generic default's embedding LayerNorm, which the graph must hold too
    classifier = tiny_classifier(n_layers=1, embedding_norm=True, embedding_std=0.1)
    ckpt = save_checkpoint(classifier, tmp_path / "tiny.ckpt")
    assert export.main(["--ckpt", str(ckpt), "--out", str(tmp_path / "out")]) == 0
    _, _, _, outputs = run_onnx(tmp_path / "out", TEXTS)
    assert list(outputs) == ["logits", "probabilities"]
    expected = np.array([[p.probabilities[name] for name in classifier.label_names]
                         for p in classifier.predict(TEXTS)])
    probabilities = torch.from_numpy(outputs["logits"]).softmax(-1).numpy()
    np.testing.assert_allclose(probabilities, expected, atol=TOLERANCE)


def test_bad_targets_and_failed_exports_are_one_line_errors(tmp_path, capsys, monkeypatch):
    ckpt = save_checkpoint(tiny_classifier(), tmp_path / "tiny.ckpt")
    (tmp_path / "file").write_text("x")
    assert export.main(["--ckpt", str(ckpt), "--out", str(tmp_path / "file")]) == 2
    assert export.main(["--ckpt", str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "o")]) == 2

    def refuse(*args, **kwargs):
        raise RuntimeError("Could not guard on data-dependent expression\nmore detail")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    assert export.main(["--ckpt", str(ckpt), "--out", str(tmp_path / "o")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and "file: exists and is not a folder" in lines[0] and "file not found" in lines[1]
    assert lines[2].startswith("error: the full attention of this checkpoint cannot be exported to ONNX: Could not")
    assert not (tmp_path / "o" / "model.onnx").exists()


def test_an_export_folder_that_cannot_be_made_is_one_line_and_an_earlier_export_stays(tmp_path, capsys, monkeypatch):
    ckpt = save_checkpoint(tiny_classifier(), tmp_path / "tiny.ckpt")
    earlier = tmp_path / "exported"
    earlier.mkdir()
    for name in ("model.onnx", "tokenizer.json", "config.json"):
        (earlier / name).write_bytes(b"earlier " + name.encode())
    before = {path.name: path.read_bytes() for path in earlier.iterdir()}
    assert export.main(["--ckpt", str(ckpt), "--out", str(earlier / "config.json" / "sub")]) == 2

    def read_only(self, *args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(type(tmp_path), "mkdir", read_only)
    assert export.main(["--ckpt", str(ckpt), "--out", str(tmp_path / "new")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2
    assert lines[0] == f"error: {earlier}/config.json/sub: cannot create the export folder: {earlier}/config.json " \
                       "is a file, not a folder"
    assert lines[1] == f"error: {tmp_path}/new: cannot create the export folder: Read-only file system"
    assert {path.name: path.read_bytes() for path in earlier.iterdir()} == before


def test_several_checkpoints_are_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        export.main(["--ckpt", "a.ckpt", "--ckpt", "b.ckpt", "--out", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("export.py: error: --ckpt given more than once")
    assert not (tmp_path / "out").exists()


def test_export_without_the_export_extra_names_it_not_the_kind(tiny_checkpoint, tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "onnxscript", None)  # as if not installed
    assert export.main(["--ckpt", str(tiny_checkpoint), "--out", str(tmp_path / "exported")]) == 2
    err = capsys.readouterr().err
    assert "onnxscript is not installed" in err and 'pip install -e ".[export]"' in err and "attention" not in err
    assert not (tmp_path / "exported").exists()  # refused before anything was made
