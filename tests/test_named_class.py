"""A checkpoint is data: a network of a user's class loads only with the class the user names on the command, and
nothing a checkpoint names is ever imported (model/own_attention/naming.py, docs/BAD_INPUT.md "A checkpoint never runs
code").

Each tool is handed a checkpoint edited to name other code, a file (absolute, or relative to the working folder) or
a module, whose import writes a marker file: the marker must stay unwritten, and the tool answer in one line naming
the class and its own flag. Then the class named by the user, with a changed file or another class's name."""

import hashlib
import sys

import lightning
import pytest
import torch

from conftest import ROOT, SMOKE, save_checkpoint, tiny_classifier

GOOD = '''import math
import torch
from torch import nn


class Good(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h = num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim, bias=False)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, x, key_padding_mask=None):
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)
        s = q @ k.transpose(-2, -1) / math.sqrt(D // self.h)
        if key_padding_mask is not None:
            s = s.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        w = s.softmax(-1)
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, L, D)), w
'''

# Imported, it writes the marker (the path is filled in), then behaves as Good, so a tool that imports it succeeds.
EVIL = "from pathlib import Path\nPath({marker!r}).write_text('imported')\n" + GOOD.replace("class Good", "class Evil")


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """(good spec, {case: checkpoint path}, marker): a checkpoint of class Good, and copies of it whose network
    names the marker-writing class by an absolute file, by a file relative to the working folder (the tools run
    there), and by a module on sys.path."""
    good = tmp_path / "good.py"
    good.write_text(GOOD)
    marker = tmp_path / "marker.txt"
    evil = tmp_path / "evilmod.py"
    evil.write_text(EVIL.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = f"{good}:Good"
    classifier = tiny_classifier(attention=spec, n_layers=1)
    ckpt = save_checkpoint(classifier, tmp_path / "good.ckpt",
                           data={"dataset": "synthetic"})
    checkpoint = torch.load(ckpt, weights_only=True) | {"pytorch-lightning_version": lightning.__version__}
    torch.save(checkpoint, ckpt)
    forged = {}
    for case, named, path in (("absolute file", f"{evil}:Evil", str(evil)), ("relative file", "evilmod.py:Evil",
                              "evilmod.py"), ("module", "evilmod:Evil", str(evil))):
        network = checkpoint["hyper_parameters"]["network"] | {
            "attention": named, "attention_source": {"spec": named, "path": path, "sha256": sha256(evil)}}
        edited = checkpoint | {"hyper_parameters": checkpoint["hyper_parameters"] | {"network": network}}
        forged[case] = tmp_path / f"{case.replace(' ', '_')}.ckpt"
        torch.save(edited, forged[case])
    yield spec, ckpt, forged, marker
    sys.modules.pop("evilmod", None)


CASES = ("absolute file", "relative file", "module")


def one_line_naming(err: str, flag: str) -> bool:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    return len(lines) == 1 and flag in lines[0] and "Evil" in lines[0]


@pytest.mark.parametrize("case", CASES)
def test_predict_imports_nothing_a_checkpoint_names(planted, case, capsys):
    import predict

    _, _, forged, marker = planted
    assert predict.main(["--ckpt", str(forged[case]), "w1 alpha"]) == 2
    captured = capsys.readouterr()
    assert not marker.exists() and captured.out == ""
    assert one_line_naming(captured.err, "--attention-class")


@pytest.mark.parametrize("case", CASES)
def test_the_api_imports_nothing_a_checkpoint_names(planted, case):
    from data.checkpoint import CheckpointError
    from inference import TextClassifier

    spec, _, forged, marker = planted
    with pytest.raises(CheckpointError) as error:
        TextClassifier.from_checkpoint(forged[case], device="cpu")
    assert not marker.exists() and "\n" not in str(error.value) and "attention=" in str(error.value)
    # Naming a class of another name, or another file, does not open the door either.
    with pytest.raises(CheckpointError, match="trained with a class named Evil, not Good"):
        TextClassifier.from_checkpoint(forged[case], device="cpu", attention=spec)
    assert not marker.exists()


@pytest.mark.parametrize("case", CASES)
def test_diagnose_imports_nothing_a_checkpoint_names(planted, case, capsys):
    import diagnose

    _, _, forged, marker = planted
    assert diagnose.main(["--ckpt", str(forged[case])]) == 2
    assert not marker.exists() and one_line_naming(capsys.readouterr().err, "--attention ")


@pytest.mark.parametrize("case", CASES)
def test_export_imports_nothing_a_checkpoint_names(planted, case, capsys, tmp_path):
    pytest.importorskip("onnxscript")
    import export

    _, _, forged, marker = planted
    assert export.main(["--ckpt", str(forged[case]), "--out", str(tmp_path / "out")]) == 2
    assert not marker.exists() and one_line_naming(capsys.readouterr().err, "--attention-class")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", CASES)
def test_prune_imports_nothing_a_checkpoint_names(planted, case):
    import prune

    _, _, forged, marker = planted
    with pytest.raises(SystemExit) as stop:
        prune.main(["--ckpt", str(forged[case])])
    assert not marker.exists() and one_line_naming(str(stop.value.code), "--attention-class")


@pytest.mark.parametrize("case", CASES)
def test_serve_and_its_workers_import_nothing_a_checkpoint_names(planted, case, capsys):
    import serve

    _, _, forged, marker = planted
    assert serve.main(["--ckpt", str(forged[case])]) == 2  # the main process: before any worker starts
    assert not marker.exists() and one_line_naming(capsys.readouterr().err, "--attention-class")
    worker = serve.ClassifierAPI(checkpoints=[str(forged[case])], device="cpu", threads=1, ig_steps=4)
    with pytest.raises(ValueError, match="--attention-class"):  # a worker loads by the same rule
        worker.setup("cpu")
    assert not marker.exists()


@pytest.mark.parametrize("case", CASES)
def test_train_ckpt_path_imports_nothing_a_checkpoint_names(planted, case, tmp_path):
    import train

    _, _, forged, marker = planted
    with pytest.raises(SystemExit) as stop:
        train.main(["validate", "--config", SMOKE, "--ckpt_path", str(forged[case]),
                    "--trainer.default_root_dir", str(tmp_path / "runs")])
    assert not marker.exists() and one_line_naming(str(stop.value.code), "--model.network.attention")


def test_a_named_class_loads_everywhere_and_a_changed_file_needs_the_flag(planted, capsys, tmp_path):
    import predict

    spec, ckpt, _, _ = planted
    assert predict.main(["--ckpt", str(ckpt), "--attention-class", spec, "w1 alpha"]) == 0
    assert capsys.readouterr().out.count("probabilities") == 1
    assert predict.main(["--ckpt", str(ckpt), "w1 alpha"]) == 2  # named once in this process: still asked for
    assert "--attention-class path/to/good.py:Good" in capsys.readouterr().err
    good = tmp_path / "good.py"
    good.write_text(GOOD + "\n# edited\n")
    assert predict.main(["--ckpt", str(ckpt), "--attention-class", spec, "w1 alpha"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--allow-changed-class" in err and "not the file" in err
    assert predict.main(["--ckpt", str(ckpt), "--attention-class", spec, "--allow-changed-class", "w1 alpha"]) == 0
    capsys.readouterr()
    assert predict.main(["--ckpt", str(ckpt), "--attention-class", "good.py:Good", "w1 alpha"]) == 2  # relative: the
    assert "not the file" in capsys.readouterr().err  # user's own spelling, from the working folder, still checked


def test_a_class_named_for_a_built_in_network_is_refused(tmp_path, capsys):
    import predict

    ckpt = save_checkpoint(tiny_classifier(n_layers=1), tmp_path / "full.ckpt")
    assert predict.main(["--ckpt", str(ckpt), "--attention-class", "x.py:X", "w1"]) == 2
    assert "a built-in kind" in capsys.readouterr().err


def test_a_checkpoint_spec_without_its_record_is_refused_not_resolved(planted):
    from model.config import ConfigError, NetworkConfig

    _, ckpt, _, marker = planted
    network = torch.load(ckpt, weights_only=True)["hyper_parameters"]["network"]
    with pytest.raises(ConfigError, match="without the attention_source"):
        NetworkConfig.from_dict(network | {"attention": "evilmod:Evil", "attention_source": None})
    assert not marker.exists()


def test_docs_state_the_rule():
    for doc in ("BAD_INPUT.md", "OWN_ATTENTION.md"):
        text = (ROOT / "docs" / doc).read_text()
        assert "--attention-class" in text and "never imports" in text, doc


def test_an_ensemble_names_the_class_for_the_members_that_have_one(planted, capsys, tmp_path):
    import predict

    spec, ckpt, _, _ = planted
    full = save_checkpoint(tiny_classifier(n_layers=1), tmp_path / "full.ckpt")
    assert predict.main(["--ckpt", str(ckpt), "--ckpt", str(full), "--attention-class", spec, "w1 alpha"]) == 0
    assert capsys.readouterr().out.count("probabilities") == 1
    assert predict.main(["--ckpt", str(ckpt), "--ckpt", str(full), "w1 alpha"]) == 2
    assert "--attention-class" in capsys.readouterr().err
