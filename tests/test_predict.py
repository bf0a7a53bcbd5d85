"""predict.py and the TextClassifier API: output shape, attention, bad checkpoints and inputs, import weight."""

import csv
import io
import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import predict
import train
from conftest import LABELS, ONE_PROBE, QUIET, ROOT, SMOKE, TEXTS, tiny_classifier
from data.checkpoint import CheckpointError
from inference import TextClassifier
from inference.classifier import COUNT_CHARACTERS
from inference.answers import prediction_outputs
from model.kinds import ATTENTION_KINDS, DEFAULT_KIND


@pytest.fixture(scope="module")
def run(smoke_run):
    """The session's smoke run (tests/conftest.py): its last checkpoint and the fit's LightningCLI."""
    return smoke_run.last, smoke_run.cli


@pytest.fixture(scope="module")
def ckpt(run):
    return run[0]


@pytest.fixture(scope="module")
def classifier(ckpt):
    return TextClassifier.from_checkpoint(ckpt, device="cpu")


def predict_cli(capsys, *args) -> tuple[int, list[dict], str]:
    """predict.main in this process: exit code, the JSON objects on stdout, stderr."""
    code = predict.main([str(arg) for arg in args])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def script(*args, stdin: bytes | None = None, python_flags=()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *python_flags, str(ROOT / "predict.py"), *map(str, args)],
        input=stdin, capture_output=True, cwd=ROOT,
    )


# --- output ---------------------------------------------------------------------------------------------------------


def test_one_json_object_per_text_with_label_names_and_probabilities_summing_to_one(ckpt, capsys):
    code, outputs, _ = predict_cli(capsys, "--ckpt", ckpt, *TEXTS)
    assert code == 0
    assert [o["text"] for o in outputs] == TEXTS
    for output in outputs:
        assert set(output) == {"text", "label", "probabilities"}
        assert list(output["probabilities"]) == LABELS
        assert sum(output["probabilities"].values()) == pytest.approx(1.0, abs=1e-5)
        assert output["label"] == max(output["probabilities"], key=output["probabilities"].get)


def test_file_and_stdin_give_the_same_output_as_arguments(ckpt, tmp_path, capsys, monkeypatch):
    _, from_arguments, _ = predict_cli(capsys, "--ckpt", ckpt, *TEXTS)
    path = tmp_path / "texts.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    _, from_file, _ = predict_cli(capsys, "--ckpt", ckpt, "--file", path)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(path.read_bytes())))
    _, from_stdin, _ = predict_cli(capsys, "--ckpt", ckpt, "--file", "-")
    assert from_file == from_arguments == from_stdin


@pytest.mark.slow  # a fresh Python process
def test_stdin_through_a_pipe_in_a_real_process(ckpt):
    result = script("--ckpt", ckpt, "--file", "-", "--top-k", "1", stdin="\n".join(TEXTS).encode())
    assert result.returncode == 0, result.stderr.decode()
    outputs = [json.loads(line) for line in result.stdout.decode().splitlines()]
    assert [o["text"] for o in outputs] == TEXTS


def test_top_k_keeps_the_k_most_likely_labels_most_likely_first(ckpt, capsys):
    _, full, _ = predict_cli(capsys, "--ckpt", ckpt, *TEXTS)
    _, top, _ = predict_cli(capsys, "--ckpt", ckpt, "--top-k", "2", *TEXTS)
    for all_labels, output in zip(full, top):
        expected = sorted(all_labels["probabilities"].items(), key=lambda pair: pair[1], reverse=True)[:2]
        assert list(output["probabilities"].items()) == expected
        assert output["label"] == expected[0][0]


@pytest.mark.parametrize("all_heads", [False, True])
def test_attention_covers_the_real_tokens_of_each_text(ckpt, run, capsys, all_heads):
    hparams = run[1].model.network
    heads_flag = ["--all-heads"] if all_heads else []
    code, outputs, _ = predict_cli(capsys, "--ckpt", ckpt, "--attention", *heads_flag, *TEXTS)
    assert code == 0
    for output in outputs:
        n = len(output["tokens"])
        weights = torch.tensor(output["attention"])
        heads = (hparams.n_heads,) if all_heads else ()
        assert weights.shape == (hparams.n_layers, *heads, n, n)  # real tokens only: no padding rows or columns
        assert torch.allclose(weights.sum(-1), torch.ones(()), atol=1e-4)  # each query row is a distribution
    assert len({len(o["tokens"]) for o in outputs}) > 1  # texts of different lengths, padded together in one batch


def test_attention_png_writes_one_readable_heatmap_per_text(ckpt, tmp_path, capsys):
    from matplotlib.image import imread

    folder = tmp_path / "heatmaps"
    code, outputs, _ = predict_cli(capsys, "--ckpt", ckpt, "--attention-png", folder, *TEXTS[:2])
    assert code == 0
    assert [o["attention_png"] for o in outputs] == [str(folder / "0000.png"), str(folder / "0001.png")]
    assert "attention" not in outputs[0]  # heatmaps alone do not fill stdout with weights
    for output in outputs:
        image = imread(output["attention_png"])
        assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100
        assert image.std() > 0  # something was drawn


def test_attention_png_of_a_text_with_dollar_signs_is_drawn_as_typed(tiny_checkpoint, tmp_path, capsys):
    texts = ["paid $5 ^_^ worth $10", "a \\ b $x_1$"]
    code, outputs, _ = predict_cli(capsys, "--ckpt", tiny_checkpoint, "--attention-png", tmp_path / "maps", *texts)
    assert code == 0 and [o["text"] for o in outputs] == texts
    assert all(Path(o["attention_png"]).stat().st_size > 0 for o in outputs)


@pytest.mark.parametrize("attention", [name for name in ATTENTION_KINDS if name != DEFAULT_KIND])
def test_weights_for_heatmaps_alone_put_no_attention_field_in_the_output(attention):
    classifier = tiny_classifier(attention)
    texts = ["alpha beta gamma", "beta beta alpha gamma delta"]
    (plain, _), _ = prediction_outputs(classifier, texts, weights=True)
    (shown, prediction), _ = prediction_outputs(classifier, texts, attention=True)
    fields = {"tokens", "attention", "attention_keys", "global_attention"}
    assert prediction.attention is not None  # the weights were computed (for the heatmap) ...
    assert fields & set(shown) == {"tokens", "attention", "attention_keys"} | (
        {"global_attention"} if attention == "sparse" else set())
    assert not fields & set(plain)  # ... and none of them is printed without --attention
    assert plain["probabilities"] == shown["probabilities"]


def test_progress_bar_only_for_large_inputs(ckpt, tmp_path, capsys):
    small, large = tmp_path / "small.txt", tmp_path / "large.txt"
    small.write_text("\n".join(TEXTS * 5) + "\n")
    large.write_text("\n".join(TEXTS * 251) + "\n")  # 1004 lines
    _, _, err = predict_cli(capsys, "--ckpt", ckpt, "--file", small)
    assert "text/s" not in err and "20/20" not in err
    _, outputs, err = predict_cli(capsys, "--ckpt", ckpt, "--file", large)
    assert len(outputs) == 1004 and "1004/1004" in err


# --- the Python API -------------------------------------------------------------------------------------------------


def test_api_agrees_with_the_cli(ckpt, classifier, capsys):
    _, outputs, _ = predict_cli(capsys, "--ckpt", ckpt, "--attention", *TEXTS)
    predictions = classifier.predict(TEXTS, attention=True)
    assert classifier.label_names == LABELS
    assert [p.to_dict() for p in predictions] == outputs


def test_batching_by_length_restores_input_order_and_changes_nothing(classifier):
    texts = TEXTS * 3
    together = classifier.predict(texts, batch_size=2)  # several batches, each padded to its longest text
    one_by_one = [classifier.predict([text])[0] for text in texts]
    assert [p.text for p in together] == texts
    for a, b in zip(together, one_by_one):
        assert a.label == b.label
        assert a.probabilities == pytest.approx(b.probabilities, abs=1e-5)


def test_saved_checkpoint_predicts_like_the_model_in_memory(run, classifier):
    _, cli = run
    network, tokenizer = cli.model.model.eval(), cli.datamodule.tokenizer
    predictions = classifier.predict(TEXTS)
    with torch.inference_mode():
        for text, prediction in zip(TEXTS, predictions):
            ids = torch.tensor([tokenizer.encode(text).ids])
            # calibrated: the temperature fitted on validation divides the logits
            expected = (network(ids).logits / cli.model.temperature).softmax(-1)[0].tolist()
            assert list(prediction.probabilities.values()) == pytest.approx(expected, abs=1e-5)
            assert prediction.label == cli.model.label_names[max(range(len(expected)), key=expected.__getitem__)]


def test_api_rejects_empty_texts_and_a_bare_string(classifier):
    with pytest.raises(ValueError, match="position"):
        classifier.predict(["alpha beta", "   "])
    with pytest.raises(TypeError):
        classifier.predict("alpha beta")


def test_a_lone_surrogate_is_its_own_error_in_the_api_and_never_fails_the_other_texts(classifier):
    texts = ["alpha beta", "\ud800 lone surrogate", "w1 alpha"]
    with pytest.raises(ValueError, match=r"1: not Unicode text: a lone surrogate U\+D800 at character 0"):
        classifier.predict(texts)
    with pytest.raises(ValueError, match="lone surrogate"):
        classifier.explain(texts)
    outputs = [out for out, _ in prediction_outputs(classifier, texts)]
    assert outputs[1] == {"text": "\ufffd lone surrogate", "error": outputs[1]["error"]}
    assert outputs[1]["error"].startswith("not Unicode text: a lone surrogate U+D800")
    alone = classifier.predict([texts[0], texts[2]])
    assert [outputs[0]["probabilities"], outputs[2]["probabilities"]] == [p.probabilities for p in alone]


def test_a_lone_surrogate_through_predict_py_is_replaced_like_any_bad_bytes(ckpt, tmp_path, capsys, monkeypatch):
    code, outputs, err = predict_cli(capsys, "--ckpt", ckpt, "\ud800 lone surrogate", "alpha beta")
    assert code == 0 and outputs[0]["text"] == "\ufffd" * 3 + " lone surrogate" and outputs[0]["label"] in LABELS
    assert "not UTF-8" in err and "text 1" in err
    data = "\ud800 lone surrogate\nalpha beta\n".encode("utf-8", "surrogatepass")  # bytes ED A0 80: not UTF-8
    (tmp_path / "texts.txt").write_bytes(data)
    assert predict_cli(capsys, "--ckpt", ckpt, "--file", tmp_path / "texts.txt")[1] == outputs
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert predict_cli(capsys, "--ckpt", ckpt, "--file", "-")[1] == outputs


# --- inputs ---------------------------------------------------------------------------------------------------------


def test_empty_lines_keep_their_place_with_an_error(ckpt, tmp_path, capsys):
    path = tmp_path / "gaps.txt"
    path.write_text(f"{TEXTS[0]}\n\n   \n{TEXTS[1]}\n")
    code, outputs, err = predict_cli(capsys, "--ckpt", ckpt, "--file", path)
    assert code == 0
    assert [o.get("error") for o in outputs] == [None, "empty text", "empty text", None]
    assert outputs[3]["text"] == TEXTS[1]
    assert "2 empty input(s)" in err and "line 2, 3" in err


def test_long_text_is_truncated_to_max_length_with_a_note(ckpt, classifier, capsys):
    long_text = " ".join(["alpha w1 beta"] * 30)
    all_tokens = classifier.tokenizer.encode(long_text).tokens  # the tokenizer itself does not truncate
    assert classifier.max_length == 24 and len(all_tokens) > 24
    code, outputs, err = predict_cli(capsys, "--ckpt", ckpt, "--attention", long_text)
    assert code == 0
    assert outputs[0]["truncated_from"] == len(all_tokens)
    assert outputs[0]["tokens"] == all_tokens[:24]  # the first max_length tokens, as in training
    assert f"text 1: {len(all_tokens)} tokens, truncated to the model's max_length of 24" in err


def test_bytes_that_are_not_utf8_are_replaced_with_a_note(ckpt, tmp_path, capsys):
    path = tmp_path / "latin1.txt"
    path.write_bytes(TEXTS[0].encode() + b"\n" + "café alpha beta".encode("latin-1") + b"\n")
    code, outputs, err = predict_cli(capsys, "--ckpt", ckpt, "--file", path)
    assert code == 0
    assert outputs[1]["text"] == "caf\ufffd alpha beta" and outputs[1]["label"] in LABELS
    assert "not UTF-8" in err and "line 2" in err


# --- bad checkpoints ------------------------------------------------------------------------------------------------


class RunsCode:
    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def make_bad_checkpoint(kind: str, ckpt: Path, tmp_path: Path) -> Path:
    path = tmp_path / f"{kind}.ckpt"
    if kind == "missing":
        return path
    if kind == "corrupt":
        path.write_bytes(random.Random(0).randbytes(4096))
    elif kind == "truncated":
        data = ckpt.read_bytes()
        path.write_bytes(data[: len(data) // 2])
    elif kind == "foreign dict":
        torch.save({"weights": torch.zeros(3)}, path)
    elif kind == "no tokenizer":
        checkpoint = torch.load(ckpt, weights_only=True)
        del checkpoint["TextDataModule"]
        torch.save(checkpoint, path)
    elif kind == "no label names":
        checkpoint = torch.load(ckpt, weights_only=True)
        checkpoint["hyper_parameters"]["label_names"] = []
        torch.save(checkpoint, path)
    elif kind.startswith("runs code"):
        payload = RunsCode()
        payload.marker = tmp_path / "code-ran"
        if kind == "runs code":
            torch.save({"state_dict": payload}, path)
        else:  # the legacy format torch.load also reads: a bare pickle
            with open(path, "wb") as f:
                pickle.dump({"state_dict": payload}, f, protocol=2)
    return path


BAD_CHECKPOINTS = {
    "missing": "file not found",
    "corrupt": "not a checkpoint written by train.py (not a zip archive)",
    "truncated": "truncated or damaged",
    "foreign dict": "not a checkpoint of this project: missing 'state_dict', 'hyper_parameters'",
    "no tokenizer": "no tokenizer (the 'TextDataModule' entry",
    "no label names": "no label names (hyper_parameters 'label_names' is empty)",
    "runs code": "refused to load",
    "runs code, bare pickle": "a plain pickle file",
}


@pytest.mark.parametrize("kind", BAD_CHECKPOINTS)
def test_bad_checkpoint_gives_one_line_error_and_exit_code_2(kind, ckpt, tmp_path, capsys):
    path = make_bad_checkpoint(kind, ckpt, tmp_path)
    code, outputs, err = predict_cli(capsys, "--ckpt", path, "alpha beta")
    assert code == 2 and outputs == []
    assert err == f"error: {path}: {err.split(': ', 2)[2]}"  # one line, naming the file
    assert err.count("\n") == 1 and BAD_CHECKPOINTS[kind] in err
    assert not (tmp_path / "code-ran").exists()
    with pytest.raises(CheckpointError, match=str(path)):
        TextClassifier.from_checkpoint(path)


@pytest.mark.slow  # a fresh Python process
def test_bad_checkpoint_in_a_real_process_has_no_traceback_unless_debug(ckpt, tmp_path):
    path = make_bad_checkpoint("truncated", ckpt, tmp_path)
    quiet = script("--ckpt", path, "alpha")
    assert quiet.returncode == 2 and quiet.stdout == b""
    assert quiet.stderr.decode().startswith(f"error: {path}: truncated") and b"Traceback" not in quiet.stderr
    # --debug lets the CheckpointError out of predict.main: Python prints its traceback and exits non-zero.
    with pytest.raises(CheckpointError, match="truncated"):
        predict.main(["--ckpt", str(path), "--debug", "alpha"])


def test_missing_input_file_is_a_one_line_error(ckpt, tmp_path, capsys):
    code, _, err = predict_cli(capsys, "--ckpt", ckpt, "--file", tmp_path / "nope.txt")
    assert code == 2 and err == f"error: {tmp_path / 'nope.txt'}: file not found\n"


# --- start-up weight ------------------------------------------------------------------------------------------------

HEAVY = {"lightning", "pytorch_lightning", "torchmetrics", "datasets", "matplotlib", "tensorboard"}


def imported_top_level_modules(stderr: bytes) -> set[str]:
    """Module names from `python -X importtime` lines: 'import time: self | cumulative | name'."""
    lines = [line.split("|")[-1].strip() for line in stderr.decode().splitlines() if line.startswith("import time:")]
    return {name.split(".")[0] for name in lines}


@pytest.mark.slow  # a fresh Python process
def test_predict_imports_no_lightning_or_other_heavy_packages(ckpt):
    result = script("--ckpt", ckpt, "alpha beta", python_flags=["-X", "importtime"])
    assert result.returncode == 0
    modules = imported_top_level_modules(result.stderr)
    assert "torch" in modules and "tokenizers" in modules  # the check sees real imports
    assert not modules & HEAVY


@pytest.mark.slow  # a fresh Python process
def test_heatmaps_do_import_matplotlib(ckpt, tmp_path):
    result = script("--ckpt", ckpt, "--attention-png", tmp_path, "alpha beta", python_flags=["-X", "importtime"])
    assert result.returncode == 0
    assert "matplotlib" in imported_top_level_modules(result.stderr)


def flat_layout(checkpoint: dict) -> dict:
    """The first layout: the network's settings flat in hyper_parameters, label names beside the tokenizer."""
    network = checkpoint["hyper_parameters"].pop("network")
    checkpoint["hyper_parameters"] = {k: v for k, v in network.items() if k not in ("num_classes", "attention_kernel")}
    checkpoint["TextDataModule"]["label_names"] = LABELS
    return checkpoint


def copies_beside_the_tokenizer(checkpoint: dict) -> dict:
    """The second layout: label_names and max_length also under "TextDataModule"."""
    checkpoint["TextDataModule"] |= {"label_names": LABELS, "max_length": 24}
    return checkpoint


@pytest.mark.parametrize("older", [flat_layout, copies_beside_the_tokenizer])
def test_a_checkpoint_of_an_earlier_layout_is_refused_naming_the_version_that_reads_it(ckpt, tmp_path, capsys, older):
    old = tmp_path / "old.ckpt"
    torch.save(older(torch.load(ckpt, weights_only=True)), old)
    with pytest.raises(CheckpointError, match=r"an earlier layout .*version 0\.1\.0 of this project"):
        TextClassifier.from_checkpoint(old, device="cpu")
    code, _, err = predict_cli(capsys, "--ckpt", old, *TEXTS)
    assert code != 0 and len(err.strip().splitlines()) == 1 and str(old) in err and "version 0.1.0" in err


# --- one padding rule -----------------------------------------------------------------------------------------------

SPECIAL = ["alpha [PAD] beta w1", "[PAD]", "[UNK] w2 [UNK] alpha", "beta [PAD][PAD] alpha w3 [UNK]", "w4 ##s [CLS] w5",
           "[pad] w6 beta"]


@pytest.mark.slow
def test_special_token_strings_get_the_same_ids_and_prediction_in_validate_and_predict(run, tmp_path, capsys,
                                                                                        monkeypatch):
    """A text holding "[PAD]", "[UNK]" or another special-looking string: `train.py validate` (the DataModule's
    encoding and batches) and predict.py see the same token ids and give the same probabilities. Padding comes from
    the lengths in both, so a typed "[PAD]" (id 0) is a real token in both, never masked out in one of them."""
    ckpt, cli = run
    val_file = tmp_path / "special.csv"
    with open(val_file, "w", newline="") as f:
        csv.writer(f).writerows([("text", "label"), *[(text, LABELS[i % 3]) for i, text in enumerate(SPECIAL)]])
    seen = []  # (ids of a real row, its probabilities) from every validation batch
    evaluate = type(cli.model).evaluate

    def recording(self, batch, stage, need_weights=False):
        out = evaluate(self, batch, stage, need_weights)
        for ids, padding, logits in zip(batch["input_ids"], batch["padding_mask"], out["logits"]):
            seen.append((ids[~padding].tolist(), self.probabilities(logits).tolist()))  # with its temperature
        return out

    monkeypatch.setattr(type(cli.model), "evaluate", recording)
    train.main([
        "validate", "--config", SMOKE, "--data.train_file", str(cli.datamodule.hparams.train_file),
        "--data.val_file", str(val_file), "--data.cache_dir", str(tmp_path / "cache"), "--ckpt_path", str(ckpt),
        "--trainer.default_root_dir", str(tmp_path), *QUIET, *ONE_PROBE,
    ])
    capsys.readouterr()  # validate's table of figures
    classifier = TextClassifier.from_checkpoint(ckpt, device="cpu")
    ids, _, _ = classifier.encode(SPECIAL)
    assert 0 in ids[0] and 1 in ids[2]  # the typed strings are the special tokens' ids, in both paths alike
    code, outputs, _ = predict_cli(capsys, "--ckpt", ckpt, *SPECIAL)
    assert code == 0
    assert sorted(row for row, _ in seen) == sorted(ids)  # the same ids, padding marked from the lengths
    validated = {tuple(row): probabilities for row, probabilities in seen}
    for text_ids, output in zip(ids, outputs):
        assert list(output["probabilities"].values()) == pytest.approx(validated[tuple(text_ids)], abs=1e-5)


def test_ig_steps_and_batch_size_have_an_upper_bound(tiny_checkpoint, capsys):
    for option in ("--ig-steps", "--batch-size"):
        with pytest.raises(SystemExit) as stop:
            predict.main(["--ckpt", str(tiny_checkpoint), "--explain", option, "100000000", "alpha"])
        assert stop.value.code == 2
        assert f"argument {option}: must be in 1.." in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"ig_steps .* must be in 1..1024, got 100000"):
        tiny_classifier().explain(["w1 w2"], ig_steps=100000)


def test_explain_with_only_empty_inputs_keeps_the_page_and_says_why(tiny_checkpoint, tmp_path, capsys):
    page = tmp_path / "page.html"
    page.write_text("an earlier report")
    assert predict.main(["--ckpt", str(tiny_checkpoint), "--explain", "--html", str(page), " ", ""]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == f"error: {page}: not written: every input is empty, there is nothing to explain\n"
    assert page.read_text() == "an earlier report"


def test_explain_counts_empty_inputs_and_refuses_its_input_file_as_the_page(tiny_checkpoint, tmp_path, capsys):
    assert predict.main(["--ckpt", str(tiny_checkpoint), "--explain", "w1 alpha", " "]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out.splitlines()[1]) == {"text": " ", "error": "empty text"}
    assert '1 empty input(s) reported as {"error": "empty text"} (text 2)' in err
    texts = tmp_path / "texts.txt"
    texts.write_text("w1 alpha\n")
    assert predict.main(["--ckpt", str(tiny_checkpoint), "--explain", "--file", str(texts), "--html", str(texts)]) == 2
    assert "own input" in capsys.readouterr().err and texts.read_text() == "w1 alpha\n"


def test_the_truncation_note_gives_the_texts_own_length_in_tokens(tiny_checkpoint, capsys):
    long_text = " ".join(["alpha"] * 3000)  # 15,000 characters: cut to 12 × 50 before tokenizing
    assert predict.main(["--ckpt", str(tiny_checkpoint), long_text]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["truncated_from"] == 3000
    assert "text 1: 3000 tokens, truncated to the model's max_length of 12" in err
    huge = "alpha " * (COUNT_CHARACTERS // 6 + 10)
    assert predict.main(["--ckpt", str(tiny_checkpoint), "--explain", huge]) == 0
    counted = len(huge[:COUNT_CHARACTERS].split())  # a word tokenizer: one token per word
    assert f"text 1: at least {counted} tokens; explained as" in capsys.readouterr().err


def test_help_documents_the_local_bands_slots_outside_the_text(capsys):
    with pytest.raises(SystemExit):
        predict.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "a position below 0 or past the last token is a band slot outside the text" in help_text


def test_the_page_may_not_replace_the_checkpoint_it_explains(tiny_checkpoint, capsys):
    from conftest import digest

    before = digest(tiny_checkpoint)
    assert predict.main(["--ckpt", str(tiny_checkpoint), "--explain", "--html", str(tiny_checkpoint), "w1"]) == 2
    assert "own input" in capsys.readouterr().err and digest(tiny_checkpoint) == before


def test_help_examples_read_files_that_exist_and_say_a_header_line_is_a_text(capsys):
    with pytest.raises(SystemExit):
        predict.main(["--help"])
    help_text = capsys.readouterr().out
    assert "data/sst2/validation.tsv" not in help_text  # not a file of the repository
    assert "tail -n +2" in help_text and "header line" in " ".join(help_text.split())


def test_attention_png_onto_the_checkpoint_file_is_one_line_and_touches_it_not(tiny_checkpoint, capsys):
    from conftest import digest

    before = digest(tiny_checkpoint)
    assert predict.main(["--ckpt", str(tiny_checkpoint), "--attention-png", str(tiny_checkpoint), "w1"]) == 2
    err = capsys.readouterr().err
    assert "exists and is not a folder" in err and len(err.strip().splitlines()) == 1
    assert digest(tiny_checkpoint) == before
