"""Head gates, importance, ablation and pruning: inference/heads.py, prune.py, NetworkConfig.layer_heads."""

import json
import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import predict
import prune
import train
from inference import TextClassifier
from data.checkpoint import read_checkpoint
from inference.heads import accuracy, batches, head_importance, least_important, prune_checkpoint
from model.config import ConfigError, NetworkConfig
from conftest import (KINDS, ONE_PROBE, QUIET, SHORT, SMOKE, SYNTHETIC, WORDS, digest, error_line, save_checkpoint,
                      tiny_classifier)
TEXTS = ["w1 alpha w2 beta w3", "beta w4 alpha", "w5 w6 w7 好", "alpha beta w8 w9 w10 w11"]


def logits(model, texts, classifier):
    (token_ids, mask, _), = batches(classifier, texts, [0] * len(texts), batch_size=len(texts))
    with torch.no_grad():
        return model(token_ids, mask).logits


@pytest.mark.parametrize("attention", list(KINDS))
def test_a_zero_gate_is_the_head_cut_out_of_w_o(attention):
    classifier = tiny_classifier(attention)
    model, layer = classifier.model, classifier.model.blocks[0].attention
    before = logits(model, TEXTS, classifier)
    layer.head_gate = torch.ones(2)
    assert torch.allclose(logits(model, TEXTS, classifier), before, atol=1e-6)
    layer.head_gate = torch.tensor([1.0, 0.0])
    gated = logits(model, TEXTS, classifier)
    layer.head_gate = None
    with torch.no_grad():
        layer.w_o.weight[:, layer.d_head :] = 0.0  # head 1's columns of W_O
    assert torch.allclose(logits(model, TEXTS, classifier), gated, atol=1e-6)


@pytest.mark.parametrize("attention", list(KINDS))
def test_a_pruned_checkpoint_rebuilds_exactly_the_gated_network(attention, tmp_path):
    classifier = tiny_classifier(attention)
    path = save_checkpoint(classifier, tmp_path / "full.ckpt")
    pruned = prune_checkpoint(read_checkpoint(path), [(0, 1), (1, 0)])
    torch.save(pruned, tmp_path / "pruned.ckpt")
    loaded = torch.load(tmp_path / "pruned.ckpt", weights_only=True)
    assert loaded["hyper_parameters"]["network"]["layer_heads"] == [1, 1]
    assert loaded["pruned_heads"] == [[[0, 1], [1, 0]]]
    small = TextClassifier.from_checkpoint(tmp_path / "pruned.ckpt", device="cpu")
    assert [b.attention.n_heads for b in small.model.blocks] == [1, 1]
    assert small.model.blocks[0].attention.w_q.weight.shape == (8, 16)  # one head of size 8
    blocks = classifier.model.blocks
    blocks[0].attention.head_gate, blocks[1].attention.head_gate = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    assert torch.allclose(logits(small.model, TEXTS, small), logits(classifier.model, TEXTS, classifier), atol=1e-5)


def test_importance_is_the_gradient_of_the_loss_with_respect_to_the_gate():
    classifier = tiny_classifier()
    data = batches(classifier, TEXTS, [0, 1, 0, 1], batch_size=4)
    importance = head_importance(classifier.model, data)
    layer, eps = classifier.model.blocks[1].attention, 1e-3
    token_ids, mask, labels = data[0]
    losses = []
    for gate in (1 + eps, 1 - eps):
        layer.head_gate = torch.tensor([gate, 1.0])
        with torch.no_grad():
            losses.append(float(F.cross_entropy(classifier.model(token_ids, mask).logits, labels)))
    layer.head_gate = None
    assert float(importance[1][0]) == pytest.approx(abs(losses[0] - losses[1]) / (2 * eps), rel=1e-2, abs=1e-6)


def test_accuracy_counts_right_argmaxes_and_ablation_zeroes_exactly_one_gate():
    classifier = tiny_classifier()
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 10))) for _ in range(40)]
    predicted = [classifier.label_names.index(p.label) for p in classifier.predict(texts)]
    # Labels = the full network's own predictions, so its accuracy is exactly 1 and an ablation shows as a drop.
    data = batches(classifier, texts, predicted, batch_size=16)  # sorted by length: batches of 16, 16 and 8
    predicted = torch.cat([labels for _, _, labels in data]).tolist()  # in the batches' order
    assert accuracy(classifier.model, data) == 1.0
    layer = classifier.model.blocks[0].attention
    layer.head_gate = torch.tensor([0.0, 1.0])  # head 0 of layer 0 cut by hand
    with torch.no_grad():
        ablated = torch.cat([classifier.model(t, m).logits.argmax(-1) for t, m, _ in data]).tolist()
    layer.head_gate = None
    changed = sum(a != p for a, p in zip(ablated, predicted))
    assert changed > 0  # else the comparison below could not tell ablation from none
    assert accuracy(classifier.model, data, removed=(0, 0)) == (len(texts) - changed) / len(texts)
    assert layer.head_gate is None and accuracy(classifier.model, data) == 1.0  # the gate is taken off again


def test_least_important_keeps_a_head_per_layer_and_refuses_too_many():
    importance = [torch.tensor([0.1, 0.2]), torch.tensor([0.01, 0.02])]
    assert least_important(importance, 2) == [(0, 0), (1, 0)]  # (1, 1) is next, but layer 1 must keep a head
    with pytest.raises(ValueError, match="cannot prune 3 heads: the model has 4 heads in 2 layers .* at most 2"):
        least_important(importance, 3)


def test_layer_heads_in_the_config():
    assert NetworkConfig(n_layers=2, layer_heads=(2, 1)).layer_heads == [2, 1]
    assert NetworkConfig(n_layers=2).heads_in_layer(1) == 4
    for bad in ([1], [0, 1], [5, 1]):
        with pytest.raises(ConfigError, match="layer_heads"):
            NetworkConfig(n_layers=2, layer_heads=bad)
    old = NetworkConfig(n_layers=2).to_dict()
    del old["layer_heads"]  # a checkpoint written before pruning existed
    assert NetworkConfig.from_dict(old).layer_heads is None


def test_prune_command_writes_a_checkpoint_predict_loads(tmp_path, capsys):
    classifier = tiny_classifier()
    classifier.label_names = ["0", "1"]  # the synthetic dataset's label names
    ckpt = save_checkpoint(classifier, tmp_path / "full.ckpt", data=SYNTHETIC)
    out = tmp_path / "pruned.ckpt"
    assert prune.main(["--ckpt", str(ckpt), "--importance-limit", "100", "--limit", "100",
                       "--prune", "1", "--out", str(out)]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert len(result["heads"]) == 4 and [row["heads_kept"] for row in result["table"]] == [4, 3, 2]
    assert sorted(result["pruned"]["layer_heads"]) == [1, 2]
    assert predict.main(["--ckpt", str(out), "w1 alpha"]) == 0
    assert json.loads(capsys.readouterr().out)["label"] in ("0", "1")
    assert predict.main(["--ckpt", str(out), "--attention", "w1 alpha"]) == 2  # layers differ: one-line error
    assert "different head counts" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="cannot prune 3 heads"):
        prune.main(["--ckpt", str(ckpt), "--importance-limit", "50", "--limit", "50", "--prune", "3",
                    "--out", str(out), "--no-table"])


def no_computation(monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("computed before the inputs were checked")

    import inference.heads

    monkeypatch.setattr(inference.heads, "head_importance", fail)  # prune.py imports it when it runs


@pytest.mark.parametrize("target", ["same", "directory"])
def test_prune_heads_refuses_its_input_or_a_directory_as_out_before_computing(tiny_checkpoint, tmp_path, monkeypatch,
                                                                             target):
    no_computation(monkeypatch)
    before = digest(tiny_checkpoint)
    out = tiny_checkpoint if target == "same" else tmp_path
    with pytest.raises(SystemExit) as stop:
        prune.main(["--ckpt", str(tiny_checkpoint), "--prune", "1", "--out", str(out)])
    line = error_line(stop)
    assert line.startswith(f"error: {out}: ") and ("own input" in line if target == "same" else "directory" in line)
    assert digest(tiny_checkpoint) == before


def test_prune_heads_reports_a_failed_save_in_one_line_and_writes_nothing(tiny_checkpoint, tmp_path, monkeypatch):
    def full_disk(obj, path, *args, **kwargs):
        Path(path).write_bytes(b"PK half")
        raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 192 vs 64")

    out = tmp_path / "pruned.ckpt"
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(SystemExit) as stop:
        prune.main(["--ckpt", str(tiny_checkpoint), "--importance-limit", "20", "--limit", "20", "--no-table",
                    "--prune", "1", "--out", str(out)])
    assert error_line(stop).startswith(f"error: {out}: cannot write the pruned checkpoint: [enforce fail")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.ckpt"]


@pytest.mark.slow
def test_a_pruned_network_with_other_head_counts_per_layer_is_validated_with_the_monitor(tiny_checkpoint, tmp_path):
    pruned = tmp_path / "pruned.ckpt"
    assert prune.main(["--ckpt", str(tiny_checkpoint), "--importance-limit", "20", "--limit", "20", "--no-table",
                       "--prune", "1", "--out", str(pruned)]) == 0
    assert sorted(read_checkpoint(pruned)["hyper_parameters"]["network"]["layer_heads"]) == [1, 2]
    cli = train.main(["validate", "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"),
                      "--data.max_length", "12", "--trainer.default_root_dir", str(tmp_path), "--ckpt_path",
                      str(pruned), *QUIET, *ONE_PROBE, *SHORT])
    assert "val/acc" in cli.trainer.callback_metrics
    (monitor,) = [c for c in cli.trainer.callbacks if type(c).__name__ == "AttentionMonitor"]
    assert sorted(monitor.figures.heads_of(layer) for layer in range(2)) == [1, 2]


def test_health_figures_cover_the_heads_each_layer_has():
    from model.attention import AttentionWeights
    from monitor.health import AttentionHealth

    def layer(heads):
        scores = torch.randn(2, heads, 5, 5)
        return AttentionWeights(scores.softmax(-1), scores, None)

    health = AttentionHealth()
    health.update([layer(1), layer(2)])
    figures = health.compute()
    assert [figures.heads_of(layer) for layer in range(2)] == [1, 2] and figures.heads == [1, 2]
    assert figures.entropy[0, 1].isnan() and not figures.entropy[1].isnan().any()
    assert figures.weight_sample[0, 1].isnan().all() and not figures.weight_sample[1].isnan().any()


@pytest.mark.parametrize("flag", ["--importance-limit", "--limit", "--prune"])
def test_prune_counts_are_at_least_one_and_the_error_names_the_flag(tiny_checkpoint, monkeypatch, capsys, flag):
    no_computation(monkeypatch)
    for value in ("0", "-1", "-5"):
        with pytest.raises(SystemExit) as stop:
            prune.main(["--ckpt", str(tiny_checkpoint), flag, value, *(["--out", "x.ckpt"] * (flag == "--prune"))])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and flag in err and len(err.strip().splitlines()) == 1, err


def test_prune_out_through_a_file_or_a_missing_folder_says_which(tiny_checkpoint, tmp_path, monkeypatch):
    no_computation(monkeypatch)
    (tmp_path / "under").write_text("a file")
    for out, said in ((tmp_path / "under" / "a" / "file.ckpt", f"{tmp_path / 'under'} is a file, not a folder"),
                      (tmp_path / "missing" / "file.ckpt", "does not exist")):
        with pytest.raises(SystemExit) as stop:
            prune.main(["--ckpt", str(tiny_checkpoint), "--prune", "1", "--out", str(out)])
        assert said in error_line(stop)
