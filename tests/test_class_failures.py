"""A user's attention class fails in one line, at the first place it can (model/own_attention/naming.py,
monitor/layer_contract.py, training/module.py): sys.exit at import, float64 (its output, its parameters, the default
dtype it sets), nothing to train, a class that breaks past a length, prints that would mix with a face's JSON, a 3-tuple
return."""

import pytest
import torch

from conftest import SMOKE
from model.config import ConfigError, NetworkConfig

HEAD = '''import math, sys
import torch
from torch import nn


class A(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.w_q = nn.Linear(d_model, d_model, bias=False)
        self.w_k = nn.Linear(d_model, d_model, bias=False)
        self.w_v = nn.Linear(d_model, d_model, bias=False)
        {init}

    def forward(self, x, key_padding_mask=None):
        q, k, v = self.w_q(x), self.w_k(x), self.w_v(x)
        s = q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1])
        if key_padding_mask is not None:
            s = s.masked_fill(key_padding_mask[:, None, :], float("-inf"))
        w = s.softmax(-1)
        {forward}
        return w @ v, w
'''


def write(tmp_path, init="pass", forward="pass", top="", name="mine.py") -> str:
    path = tmp_path / name
    path.write_text(top + HEAD.replace("{init}", init).replace("{forward}", forward))
    return f"{path}:A"


def one_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_sys_exit_at_import_is_one_line_in_diagnose_and_train(tmp_path, capsys):
    import diagnose
    import train

    spec = write(tmp_path, top="import sys\nsys.exit(3)\n")
    with pytest.raises(ConfigError, match=r"sys.exit\(3\)"):
        NetworkConfig(attention=spec, d_model=16, n_heads=2)
    assert diagnose.main(["--attention", spec]) == 2
    assert "sys.exit(3)" in one_line(capsys.readouterr().err)
    with pytest.raises(SystemExit) as stop:
        train.main(["fit", "--config", SMOKE, "--model.network.attention", spec,
                    "--trainer.default_root_dir", str(tmp_path / "runs")])
    assert isinstance(stop.value.code, str) and "sys.exit(3)" in one_line(stop.value.code)


def test_sys_exit_in_the_constructor_is_one_line(tmp_path):
    from model.classifier import AttentionClassifier

    spec = write(tmp_path, init="sys.exit(4)")
    with pytest.raises(ConfigError, match=r"sys.exit\(4\)"):
        AttentionClassifier(NetworkConfig(attention=spec, d_model=16, n_heads=2))


@pytest.mark.parametrize("case, init, forward, says", [
    ("float64 output", "pass", "return (w @ v).double(), w", "returns torch.float64"),
    ("float64 parameters", "self.w_v = self.w_v.double()", "pass", "holds w_v.weight (torch.float64)"),
    ("default dtype changed", "torch.set_default_dtype(torch.float64)", "pass", "changed torch's default dtype"),
])
def test_another_dtype_is_one_line_at_build(tmp_path, case, init, forward, says):
    from model.classifier import AttentionClassifier

    spec = write(tmp_path, init=init, forward=forward)
    with pytest.raises(ConfigError) as error:
        AttentionClassifier(NetworkConfig(attention=spec, d_model=16, n_heads=2))
    assert says in one_line(str(error.value))
    assert torch.get_default_dtype() == torch.float32  # the class's setting does not outlive its refusal


NO_PARAMETER = """import torch
from torch import nn


class A(nn.Module):
    def forward(self, x, key_padding_mask=None):
        s = x @ x.transpose(-2, -1) / x.shape[-1] ** 0.5
        if key_padding_mask is not None:
            s = s.masked_fill(key_padding_mask[:, None, :], float("-inf"))
        w = s.softmax(-1)
        return w @ x, w
"""


@pytest.mark.parametrize("case", ["no parameter", "frozen"])
def test_a_class_with_nothing_to_train_gets_a_gradient_fail_row(tmp_path, case, capsys):
    import diagnose

    if case == "no parameter":
        (tmp_path / "none.py").write_text(NO_PARAMETER)
        spec = f"{tmp_path / 'none.py'}:A"
    else:
        spec = write(tmp_path, init="self.requires_grad_(False)")
    assert diagnose.main(["--attention", spec, "--d-model", "16", "--heads", "1"]) == 1
    gradient = [line for line in capsys.readouterr().out.splitlines() if line.startswith("gradient ")]
    assert len(gradient) == 1 and "FAIL" in gradient[0] and "nothing to train" in gradient[0]


LONG_BREAKS = "if x.shape[1] > 64:\n            raise MemoryError('50 GB')"
LONG_NAN = "if x.shape[1] > 64:\n            return w @ v * float('nan'), w"


@pytest.mark.parametrize("forward", [LONG_BREAKS, LONG_NAN], ids=["raises", "nan"])
def test_a_class_that_breaks_past_a_length_fails_the_long_input_check_and_is_refused_before_training(
        tmp_path, forward, capsys):
    import diagnose
    from training.module import ClassifierModule

    spec = write(tmp_path, forward=forward)
    assert diagnose.main(["--attention", spec, "--d-model", "16", "--heads", "1"]) == 1
    out = capsys.readouterr().out
    assert any(line.startswith("long-input") and "FAIL" in line and "128 tokens" in line for line in out.splitlines())
    assert diagnose.main(["--attention", spec, "--d-model", "16", "--heads", "1", "--max-length", "64"]) == 0
    capsys.readouterr()
    with pytest.raises(ConfigError) as error:
        ClassifierModule(network=NetworkConfig(attention=spec, d_model=16, n_heads=1, max_length=100))
    assert "a text of 100 tokens" in one_line(str(error.value)) and "data.max_length" in str(error.value)
    ClassifierModule(network=NetworkConfig(attention=spec, d_model=16, n_heads=1, max_length=64))


def test_diagnose_refuses_flags_it_would_ignore(tmp_path, capsys):
    import diagnose

    for flags in (["--map", "q=a,k=b,v=c"], ["--learn"], ["--heads", "2"], ["--args", "{}"], ["--d-model", "8"]):
        with pytest.raises(SystemExit) as stop:
            diagnose.main(["--ckpt", str(tmp_path / "x.ckpt"), *flags])
        assert stop.value.code == 2 and f"{flags[0]} go with --attention alone" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        diagnose.main(["--attention", "x.py:A", "--data.dataset", "sst2"])
    assert "--data.dataset go with --ckpt" in capsys.readouterr().err


# ---- the faces ------------------------------------------------------------------------------------------------------

BREAKS_PAST_8 = "if x.shape[1] > 8:\n            raise RuntimeError('would allocate 50 GB')"


def own_checkpoint(tmp_path, forward="pass", init="pass"):
    from conftest import save_checkpoint, tiny_classifier

    spec = write(tmp_path, init=init, forward=forward)
    classifier = tiny_classifier(attention=spec, n_layers=1)
    return spec, classifier, save_checkpoint(classifier, tmp_path / "own.ckpt")


TEXTS = ["w1 alpha", "w1 w2 w3 w4 w5 w6 w7 w8 w9 beta", "beta"]  # the second is 10 tokens: past what the class reads


def test_one_texts_failure_is_that_texts_in_predict(tmp_path, capsys):
    import json

    import predict

    spec, _, ckpt = own_checkpoint(tmp_path, forward=BREAKS_PAST_8)
    assert predict.main(["--ckpt", str(ckpt), "--attention-class", spec, *TEXTS]) == 0
    captured = capsys.readouterr()
    answers = [json.loads(line) for line in captured.out.splitlines()]
    assert [("label" in a, "error" in a) for a in answers] == [(True, False), (False, True), (True, False)]
    assert "the model failed on this text: RuntimeError: would allocate 50 GB" == answers[1]["error"]
    assert "text 2: the model failed on this text" in captured.err


def test_one_texts_failure_is_that_texts_in_serve(tmp_path):
    from inference.answers import answer_batch
    from inference.request import PredictRequest

    _, classifier, _ = own_checkpoint(tmp_path, forward=BREAKS_PAST_8)
    (answer,) = answer_batch(classifier, [PredictRequest(texts=TEXTS)])
    assert "error" not in answer
    assert ["error" in p for p in answer["predictions"]] == [False, True, False]


def test_a_class_that_prints_leaves_stdout_to_the_json(tmp_path, capsys):
    import json

    import predict

    spec, _, ckpt = own_checkpoint(tmp_path, forward="print('hello from forward')")
    capsys.readouterr()  # what building it printed here
    assert predict.main(["--ckpt", str(ckpt), "--attention-class", spec, *TEXTS]) == 0
    captured = capsys.readouterr()
    assert [json.loads(line)["text"] for line in captured.out.splitlines()] == TEXTS
    assert "hello from forward" in captured.err


def test_prune_refuses_to_cut_a_user_class_in_one_line(tmp_path):
    import prune

    spec, _, ckpt = own_checkpoint(tmp_path)
    with pytest.raises(SystemExit) as stop:
        prune.main(["--ckpt", str(ckpt), "--attention-class", spec, "--prune", "1", "--out", str(tmp_path / "p.ckpt")])
    assert "cannot be cut" in one_line(str(stop.value.code)) and not (tmp_path / "p.ckpt").exists()


def test_a_three_tuple_is_refused_as_documented(tmp_path):
    from model.own_attention import OwnAttention

    spec = write(tmp_path, forward="return w @ v, w, s")
    with pytest.raises(ConfigError) as error:
        OwnAttention(spec, d_model=16, n_heads=1)
    assert "returned 3 values; expected out or (out, weights)" in one_line(str(error.value))


@pytest.mark.parametrize("argument, init, says", [
    ("window", "pass", "--args '{\"window\": ...}'"),
    # a config object is made from the network's sizes; an attribute it lacks is named with the flag that gives it
    ("config", "self.window = config.window", "--args '{\"config\": {\"window\": ...}}'"),
])
def test_constructor_hints_name_the_commands_own_flag(tmp_path, capsys, argument, init, says):
    import diagnose

    path = tmp_path / "needs.py"
    path.write_text(HEAD.replace("def __init__(self, d_model)", f"def __init__(self, d_model, {argument})")
                    .replace("{init}", init).replace("{forward}", "pass"))
    assert diagnose.main(["--attention", f"{path}:A"]) == 2
    line = one_line(capsys.readouterr().err)
    assert says in line and "--model.network" not in line


def test_bench_scale_setup_refuses_a_value_of_the_wrong_type_in_one_line(capsys):
    from bench import scale

    with pytest.raises(SystemExit) as stop:
        scale.main(["setup", "batch_size=abc"])
    assert one_line(str(stop.value.code)) == "error: setup 'batch_size=abc': batch_size takes int, got str 'abc'"


def test_a_nan_loss_of_a_user_class_names_the_class_not_the_learning_rate(tmp_path):
    from training.module import non_finite_cause

    spec = write(tmp_path)
    network = NetworkConfig(attention=spec, d_model=16, n_heads=1)
    said = non_finite_cause(network, 1e-3, torch.tensor([[float("nan"), 0.0]]))
    assert f"the attention class {spec} computed them" in said
    assert "likely too high" in non_finite_cause(NetworkConfig(), 1e-3, torch.tensor([[float("nan"), 0.0]]))


FLOW = '''import math
import torch
from torch import nn


class Flow(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=False)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, x, key_padding_mask=None):
        q, k, v = self.qkv(x).chunk(3, -1)
        s = q @ k.transpose(-2, -1) / math.sqrt(x.shape[-1])
        if key_padding_mask is not None and key_padding_mask.any():
            s = s.masked_fill(key_padding_mask[:, None, :], float("-inf"))
        w = s.softmax(-1)
        return self.out_proj(w @ v), w
'''


@pytest.mark.slow
def test_export_of_untraceable_code_is_one_plain_line_and_leaves_no_folder(tmp_path, capsys):
    pytest.importorskip("onnxscript")
    import export
    from conftest import save_checkpoint, tiny_classifier

    (tmp_path / "flow.py").write_text(FLOW)
    spec = f"{tmp_path / 'flow.py'}:Flow"
    ckpt = save_checkpoint(tiny_classifier(attention=spec, n_layers=1), tmp_path / "flow.ckpt")
    out = tmp_path / "out"
    assert export.main(["--ckpt", str(ckpt), "--out", str(out), "--attention-class", spec]) == 2
    captured = capsys.readouterr()
    line = one_line(captured.err)
    assert captured.out == "" and "\x1b[" not in line and "Next steps" not in line
    assert "flow.py" in line and "key_padding_mask.any()" in line
    assert not out.exists()


def test_a_failure_every_text_meets_alike_stays_the_requests():
    from conftest import tiny_classifier
    from inference.answers import answer_batch
    from inference.request import PredictRequest

    classifier = tiny_classifier()
    predict = classifier.predict

    def refuses_attention(texts, attention=False, **options):
        if attention:
            raise ValueError("attention of a pruned model with layers of other head counts")
        return predict(texts, **options)

    classifier.predict = refuses_attention
    answers = answer_batch(classifier, [PredictRequest(texts=["w1", "w2 beta"], attention=True),
                                        PredictRequest(texts=["w3"])])
    assert set(answers[0]) == {"error"} and "predictions" in answers[1]


def test_a_slow_class_shows_progress_with_an_estimate(tmp_path, capsys, monkeypatch):
    import diagnose

    monkeypatch.setattr(diagnose.SlowClassProgress, "SLOW_AFTER", 0.0)  # as if every forward took seconds
    monkeypatch.setattr(diagnose.SlowClassProgress, "PROGRESS_EVERY", 0.0)
    spec = write(tmp_path)
    assert diagnose.main(["--attention", spec, "--d-model", "16", "--heads", "1"]) == 0
    captured = capsys.readouterr()
    progress = [line for line in captured.err.splitlines() if "forwards of the class" in line]
    assert progress and "s more" in progress[-1] and "forwards of the class" not in captured.out


@pytest.mark.slow
def test_a_note_is_logged_once_per_run_not_at_every_validation(tmp_path, caplog):
    import logging

    import train

    caplog.set_level(logging.INFO, logger="monitor.callback")
    spec = write(tmp_path)
    train.main(["fit", "--config", SMOKE, "--model.network.attention", spec, "--trainer.max_epochs", "2",
                "--trainer.limit_train_batches", "3", "--trainer.limit_val_batches", "2",
                "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(tmp_path / "runs")])
    notes = [r.getMessage() for r in caplog.records if r.name == "monitor.callback" and "user-class" in r.getMessage()]
    assert len(notes) == 1, notes
