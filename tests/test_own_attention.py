"""A user's own attention class, unchanged, as a kind (model/own_attention/layer.py, model/own_attention/mask_probe.py):
a class in the course's form (docs/examples/course_attention.py), each mask convention users write found by probing, bad
specs in one line, a changed class file refused, a checkpoint rebuilt through predict's API, and a short training
run."""

import copy
import math
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import ROOT, SHORT, fit, padding_mask, save_checkpoint, tiny_classifier
from model.config import ConfigError, NetworkConfig
from model.own_attention import ALLOW_CHANGED, OwnAttention, build_user_layer, load_attention_class, named_network

SEED_FILE = ROOT / "docs" / "examples" / "course_attention.py"
SEED = f"{SEED_FILE}:SelfAttention"


def padded_equals_alone(layer: OwnAttention, lengths=(6, 4, 1), d_model=16) -> float:
    """Largest difference between each real token's output in a padded batch and its text's output run alone."""
    torch.manual_seed(1)
    L = max(lengths)
    x = torch.randn(len(lengths), L, d_model)
    padding = padding_mask(lengths, L)
    layer.eval()
    with torch.no_grad():
        out, weights = layer(x, padding, need_weights=True)
        worst = max(float((out[i, :n] - layer(x[i:i + 1, :n])[0][0]).abs().max()) for i, n in enumerate(lengths))
        if weights is not None:  # padded keys get exactly 0 from real queries
            worst = max(worst, float(weights.weights.masked_fill(~padding[:, None, None, :], 0)[
                ~padding[:, None, :, None].expand_as(weights.weights)].abs().max()))
    return worst


# ---- the course's class -------------------------------------------------------------------------------------------


def test_seed_class_takes_no_mask_and_gets_an_output_projection():
    layer = OwnAttention(SEED, d_model=16, n_heads=2, d_head=8)
    assert type(layer.user).__name__ == "SelfAttention" and layer.user.d_k == 8  # d_k filled from the head size
    assert layer.convention.startswith("takes no mask")
    assert (layer.n_heads, layer.width) == (1, 8)
    assert layer.w_o.weight.shape == (16, 8)  # its width 8 ≠ d_model 16: the product's W_O
    assert layer.w_q is layer.user.W_Q and layer.w_v is layer.user.W_V  # read by name, registered once
    assert len(list(layer.parameters())) == 4
    assert padded_equals_alone(layer) < 1e-5  # run by length: no key it sees is padding


def test_seed_class_hands_out_its_weights_and_no_scores():
    layer = OwnAttention(SEED, d_model=16, n_heads=2, attention_args={"d_k": 16})
    assert layer.w_o is None  # width = d_model: nothing added
    x, padding = torch.randn(2, 5, 16), padding_mask([5, 3], 5)
    out, weights = layer(x, padding, need_weights=True)
    assert out.shape == (2, 5, 16) and weights.weights.shape == (2, 1, 5, 5)
    assert torch.allclose(weights.weights[1, 0, :3].sum(-1), torch.ones(3))
    assert torch.isnan(weights.scores).all()  # the class hands out no scores: never guessed
    real = ~padding
    packed, _ = layer.forward_packed(x[real], padding)
    assert torch.allclose(packed, out[real], atol=1e-6)


def test_user_class_is_built_as_the_user_would_and_the_probe_draws_no_global_random_numbers():
    cls = load_attention_class(SEED)
    torch.manual_seed(0)
    layer = OwnAttention(cls, d_model=16, n_heads=2, d_head=8)
    after_adapter = torch.rand(3)
    torch.manual_seed(0)
    by_hand = cls(d_model=16, d_k=8)
    nn.Linear(8, 16, bias=False)  # the output projection the adapter adds
    assert torch.equal(torch.rand(3), after_adapter)  # the probes use their own generator
    assert all(torch.equal(a, b) for a, b in zip(layer.user.state_dict().values(), by_hand.state_dict().values()))
    assert type(build_user_layer(cls, 16, 2, 8)) is cls


# ---- mask conventions, found by probing ---------------------------------------------------------------------------


class Heads(nn.Module):
    """softmax(Q Kᵀ/√d + bias) V over 2 heads with one fused qkv Linear and out_proj; subclasses read their mask."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.h = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def attend(self, x, blocked=None, bias=None):
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)  # each (B, H, L, d)
        s = q @ k.transpose(-2, -1) / math.sqrt(D // self.h)
        if blocked is not None:
            s = s.masked_fill(blocked, float("-inf"))
        if bias is not None:
            s = s + bias
        w = s.softmax(-1)
        return self.out_proj((w @ v).transpose(1, 2).reshape(B, L, D)), w


class PadBool(Heads):  # PyTorch's key_padding_mask
    def forward(self, x, key_padding_mask=None):
        return self.attend(x, None if key_padding_mask is None else key_padding_mask[:, None, None, :])


class KeepBool(Heads):
    def forward(self, x, mask):
        return self.attend(x, ~mask[:, None, None, :])


class KeepFloat(Heads):  # Hugging Face's attention_mask, made additive inside
    def forward(self, x, attention_mask=None):
        return self.attend(x, bias=None if attention_mask is None else (1.0 - attention_mask[:, None, None, :]) * -1e9)


class KeepLong(Heads):
    def forward(self, x, attention_mask):
        assert attention_mask.dtype == torch.long
        return self.attend(x, attention_mask[:, None, None, :] == 0)


class AdditiveExtended(Heads):  # BERT's extended mask, (B, 1, 1, L)
    def forward(self, x, attn_mask=None):
        return self.attend(x, bias=attn_mask)


class AdditiveRowsToo(Heads):
    """Adds the mask over the queries as well: -inf leaves padded rows with no key (NaN), a finite one does not."""

    def forward(self, x, mask):
        return self.attend(x, bias=mask[:, None, None, :] + mask[:, None, :, None])


class PadSquare(Heads):  # (B, L, L), row i the keys query i may not see
    def forward(self, x, mask=None):
        return self.attend(x, None if mask is None else mask[:, None])


class IgnoresItsMask(Heads):
    def forward(self, x, mask=None):
        return self.attend(x)


class SingleOutNoWeights(nn.Module):  # returns out only; positional mask
    def __init__(self, dim):
        super().__init__()
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))

    def forward(self, x, m):
        s = self.to_q(x) @ self.to_k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        return s.masked_fill(m[:, None, :], -1e4).softmax(-1) @ self.to_v(x)


class KeepSquareOnly(nn.Module):
    """Needs a (B, L, L) mask, True = may see: a (B, L) mask broadcasts into its batch axis without an error."""

    def __init__(self, dim):
        super().__init__()
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))

    def forward(self, x, mask):
        s = self.to_q(x) @ self.to_k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        return s.unsqueeze(1).masked_fill(mask.unsqueeze(1) == 0, -1e9).softmax(-1).squeeze(1) @ self.to_v(x)


class KeepOnlyForTheOutput(nn.Module):
    """Reads attention_mask two ways: 1 = padding in the scores, 1 = keep on the output. Under "True = padding" the
    padding is right, and every real token's output is zeroed, its text alone as well: a keep-all mask must change
    nothing, so no convention is this class's."""

    def __init__(self, dim):
        super().__init__()
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim, bias=False) for _ in range(3))

    def forward(self, x, attention_mask=None):
        s = self.to_q(x) @ self.to_k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        if attention_mask is None:
            return s.softmax(-1) @ self.to_v(x)
        s = s + attention_mask[:, None, :].float() * -1e4
        return (s.softmax(-1) @ self.to_v(x)) * attention_mask[:, :, None].float()


CONVENTIONS = [  # class, what the probe must find
    (PadBool, "forward(x, key_padding_mask=mask), bool True = padding, shape (B, L)"),
    (KeepBool, "forward(x, mask=mask), bool True = keep, shape (B, L)"),
    (KeepFloat, "forward(x, attention_mask=mask), 1/0 keep (float), shape (B, L)"),
    (KeepLong, "forward(x, attention_mask=mask), 1/0 keep (long), shape (B, L)"),
    (AdditiveExtended, "forward(x, attn_mask=mask), additive 0 / -inf, shape (B, 1, 1, L)"),
    (AdditiveRowsToo, "forward(x, mask=mask), additive 0 / -1e4, shape (B, L)"),
    (PadSquare, "forward(x, mask=mask), bool True = padding, shape (B, L, L)"),
    (SingleOutNoWeights, "forward(x, mask), bool True = padding, shape (B, L)"),
    (IgnoresItsMask, "takes no mask"),
    (KeepSquareOnly, "forward(x, mask=mask), bool True = keep, shape (B, L, L)"),
    (KeepOnlyForTheOutput, "takes no mask"),
]


@pytest.mark.parametrize("cls, found", CONVENTIONS, ids=[c.__name__ for c, _ in CONVENTIONS])
def test_mask_convention_is_found_by_probing(cls, found, caplog):
    with caplog.at_level("INFO", logger="model.own_attention"):
        layer = OwnAttention(cls, d_model=16, n_heads=2)
    assert found in layer.convention
    assert any(found in record.message for record in caplog.records)  # said in the log
    assert padded_equals_alone(layer) < 1e-4  # and it is right: padding changes no real token's output


def test_weights_a_class_does_not_return_are_read_from_its_softmax():
    layer = OwnAttention(SingleOutNoWeights, d_model=16, n_heads=2).eval()
    x, padding = torch.randn(2, 5, 16), padding_mask([5, 3], 5)
    _, weights = layer(x, padding, need_weights=True)
    user = layer.user
    scores = user.to_q(x) @ user.to_k(x).transpose(-2, -1) / 4.0
    expected = scores.masked_fill(padding[:, None, :], -1e4).softmax(-1)  # what its forward computed
    assert torch.allclose(weights.weights[:, 0], expected, atol=1e-6)


class ExpNormalised(nn.Module):
    """Weights made by exp and a sum, not a softmax: nothing the product can see hands them out."""

    def __init__(self, dim):
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
        e = (scores - scores.amax(-1, keepdim=True)).exp()
        return (e / e.sum(-1, keepdim=True)) @ v


def test_a_class_whose_weights_cannot_be_seen_runs_without_heatmaps():
    layer = OwnAttention(ExpNormalised, d_model=16, n_heads=2).eval()
    assert layer.weights_from is None
    x = torch.randn(2, 5, 16)
    out, weights = layer(x, need_weights=True)
    assert weights is None and torch.allclose(out, layer.user(x))


def test_heads_are_gated_through_the_class_output_projection():
    layer = OwnAttention(PadBool, d_model=16, n_heads=2).eval()
    assert layer.n_heads == 2 and layer.gates_heads
    x = torch.randn(2, 5, 16)
    whole = layer(x)[0]
    layer.head_gate = torch.tensor([1.0, 0.0])
    only_first = layer(x)[0]
    layer.head_gate = None
    q, k, v = layer.user.qkv(x).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
    heads = ((q @ k.transpose(-2, -1) / math.sqrt(8)).softmax(-1) @ v).transpose(1, 2)  # (B, L, H, d)
    expected = layer.user.out_proj(torch.cat([heads[:, :, 0], torch.zeros_like(heads[:, :, 1])], -1))
    assert torch.allclose(only_first, expected, atol=1e-5) and not torch.allclose(whole, only_first)
    twin = copy.deepcopy(layer)  # an averaged (EMA) copy gates its own heads, not the original's
    twin.head_gate = torch.tensor([1.0, 0.0])
    assert torch.allclose(twin(x)[0], expected, atol=1e-5) and torch.allclose(layer(x)[0], whole)


# ---- bad specs: one line each -------------------------------------------------------------------------------------


def write_class(tmp_path, source: str, name="mine.py"):
    path = tmp_path / name
    path.write_text(source)
    return path


BAD_SPECS = {  # file contents (None: no file), spec suffix, what the line says
    "missing file": (None, ":A", "not found"),
    "no such class": ("import torch.nn as nn\nclass B(nn.Module):\n    pass\n", ":A", "no class A in"),
    "import failed": ("import torch\nraise RuntimeError('broken on purpose\\nsecond line')\n", ":A",
                      "failed: RuntimeError: broken on purpose"),
    "not a module": ("class A:\n    pass\n", ":A", "is not an nn.Module subclass"),
    "unfillable argument": ("import torch.nn as nn\nclass A(nn.Module):\n    def __init__(self, d_model, window):\n"
                            "        super().__init__()\n", ":A", "--model.network.attention_args '{\"window\": ...}'"),
}


@pytest.mark.parametrize("case", BAD_SPECS)
def test_bad_spec_is_one_line(tmp_path, case):
    source, suffix, says = BAD_SPECS[case]
    path = tmp_path / f"{case.replace(' ', '_')}.py"
    if source is not None:
        path.write_text(source)
    with pytest.raises(ConfigError) as error:
        NetworkConfig(attention=f"{path}{suffix}", d_model=16, n_heads=2)
    message = str(error.value)
    assert "\n" not in message and says in message


def test_train_py_refuses_a_bad_spec_in_one_line_before_reading_data(tmp_path):
    import train

    with pytest.raises(SystemExit) as stop:
        train.main(["fit", "--config", str(ROOT / "configs" / "smoke.yaml"), "--model.network.attention",
                    str(tmp_path / "missing.py:Attention"), "--trainer.default_root_dir", str(tmp_path)])
    assert stop.value.code == f"error: attention '{tmp_path / 'missing.py:Attention'}': file {tmp_path / 'missing.py'} " \
                              "not found: this network needs its class file"
    assert not (tmp_path / "lightning_logs").exists()


def test_unknown_attention_args_and_unreadable_output_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="attention_args 'nope'"):
        NetworkConfig(attention=SEED, d_model=16, n_heads=2, attention_args={"nope": 1})
    path = write_class(tmp_path, "import torch.nn as nn\nclass A(nn.Module):\n    def __init__(self, dim):\n"
                                 "        super().__init__()\n    def forward(self, x):\n        return x.sum(-1)\n")
    with pytest.raises(ConfigError) as error:
        OwnAttention(f"{path}:A", d_model=16, n_heads=2)
    assert "\n" not in str(error.value) and "expected out (B, L, W)" in str(error.value)


def test_built_in_settings_are_refused_for_a_user_class():
    with pytest.raises(ConfigError, match="scale 0.5 applies to the built-in attention kinds"):
        NetworkConfig(attention=SEED, d_model=16, n_heads=2, scale=0.5)


# ---- the class file, recorded and checked -------------------------------------------------------------------------


def test_a_changed_class_file_is_refused_unless_allowed(tmp_path, monkeypatch):
    path = tmp_path / "mine.py"
    shutil.copy(SEED_FILE, path)  # a user's own file, which they may edit later
    config = NetworkConfig(attention=f"{path}:SelfAttention", d_model=16, n_heads=2)
    assert config.attention_source["path"] == str(path.resolve()) and len(config.attention_source["sha256"]) == 64
    assert NetworkConfig.from_dict(config.to_dict()) == config  # a record is data: read without the file
    spec = f"{path}:SelfAttention"
    assert named_network(config.to_dict(), spec, flag="--x")["attention_source"] == config.attention_source
    path.write_text(path.read_text() + "\n# edited\n")
    with pytest.raises(ConfigError) as error:
        named_network(config.to_dict(), spec, flag="--x", override="--let-it")
    assert "\n" not in str(error.value) and "not the file this network was trained with" in str(error.value) \
        and "--let-it" in str(error.value)
    assert named_network(config.to_dict(), spec, flag="--x", allow_changed=True)["attention_source"]["sha256"] \
        != config.attention_source["sha256"]
    monkeypatch.setenv(ALLOW_CHANGED, "1")
    assert named_network(config.to_dict(), spec, flag="--x")["attention_source"]["sha256"] \
        != config.attention_source["sha256"]
    path.unlink()
    with pytest.raises(ConfigError, match=f"file {path} not found"):
        named_network(config.to_dict(), spec, flag="--x")


def test_a_class_of_another_name_is_refused(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(SEED_FILE.read_text() + "\n\nclass Other(SelfAttention):\n    pass\n")
    config = NetworkConfig(attention=f"{path}:SelfAttention", d_model=16, n_heads=2)
    with pytest.raises(ConfigError, match="trained with a class named SelfAttention, not Other"):
        named_network(config.to_dict(), f"{path}:Other", flag="--x")


def test_a_dotted_module_path_loads(tmp_path, monkeypatch):
    (tmp_path / "userpkg").mkdir()
    (tmp_path / "userpkg" / "__init__.py").write_text("")
    shutil.copy(SEED_FILE, tmp_path / "userpkg" / "attn.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec in ("userpkg.attn:SelfAttention", "userpkg.attn.SelfAttention"):
        config = NetworkConfig(attention=spec, d_model=16, n_heads=2)
        assert config.attention_source["path"] == str((tmp_path / "userpkg" / "attn.py").resolve())
    sys.modules.pop("userpkg.attn", None)
    sys.modules.pop("userpkg", None)


def test_checkpoint_round_trips_through_predict_api(tmp_path):
    import lightning

    from inference import TextClassifier

    classifier = tiny_classifier(attention=SEED)
    path = save_checkpoint(classifier, tmp_path / "own.ckpt")
    checkpoint = torch.load(path, weights_only=True)  # plain data only
    assert checkpoint["hyper_parameters"]["network"]["attention_source"]["spec"] == SEED
    torch.save(checkpoint | {"pytorch-lightning_version": lightning.__version__}, path)
    loaded = TextClassifier.from_checkpoint(path, device="cpu", attention=SEED)
    texts = ["w1 alpha w2 beta", "beta w3", "w4 w5 w6 w7 w8 w9"]
    before, after = classifier.predict(texts, attention=True), loaded.predict(texts, attention=True)
    for a, b in zip(before, after):
        assert a.label == b.label and a.probabilities == pytest.approx(b.probabilities, abs=1e-6)
        assert torch.allclose(torch.as_tensor(a.attention), torch.as_tensor(b.attention), atol=1e-6)


# ---- training -----------------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_seed_class_trains_and_draws_heatmaps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from inference import TextClassifier

    fit(tmp_path, "--model.network.attention", SEED, *SHORT, "--trainer.max_epochs", "1")
    run = tmp_path / "lightning_logs" / "version_0"
    events = EventAccumulator(str(run), size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    assert "attention/probe_0" in events.Tags()["images"]
    entropy = events.Scalars("attention_health/entropy/layer0_head0")[-1].value
    assert 0.0 < entropy <= 1.0
    assert events.Scalars("attention_health/pad_weight/layer0_head0")[-1].value == 0.0
    (best,) = (run / "checkpoints").glob("best-*.ckpt")
    prediction = TextClassifier.from_checkpoint(best, device="cpu", attention=SEED).predict(["alpha w1 beta"],
                                                                                            attention=True)[0]
    assert len(prediction.tokens) == 3 and torch.as_tensor(prediction.attention).shape[-1] == 3


def test_serve_answers_attention_and_explanations(tmp_path):
    from inference.answers import answer_batch, model_info
    from inference.request import PredictRequest

    classifier = tiny_classifier(attention=SEED)
    classifier.label_names = ["neg", "pos"]
    texts = ["w1 alpha w2 beta", "beta w3"]
    attention, explained = answer_batch(classifier, [PredictRequest(texts=texts, attention=True),
                                                     PredictRequest(texts=texts[:1], explain=True)], ig_steps=4)
    assert "error" not in attention and "error" not in explained
    rows = attention["predictions"][1]["attention"][0]  # layer 0: the mean over heads, one row per token
    assert len(rows) == 2 and all(sum(row) == pytest.approx(1.0, abs=1e-5) for row in rows)
    scores = explained["predictions"][0]["scores"]
    assert len(scores["attention"]) == len(scores["occlusion"]) == 4  # a weight per token (w1 alpha w2 beta)


MASKED_CLASS = '''import math
import torch
from torch import nn


class Attention(nn.Module):
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


@pytest.mark.slow
def test_export_keeps_a_masked_class_and_refuses_one_without_mask(tmp_path, capsys):
    import lightning
    import numpy as np
    import onnxruntime
    from tokenizers import Tokenizer

    import export

    path = write_class(tmp_path, MASKED_CLASS)
    for spec, exported in ((f"{path}:Attention", True), (SEED, False)):
        classifier = tiny_classifier(attention=spec)
        ckpt = save_checkpoint(classifier, tmp_path / "own.ckpt")
        torch.save(torch.load(ckpt, weights_only=True) | {"pytorch-lightning_version": lightning.__version__}, ckpt)
        out = tmp_path / f"out_{exported}"
        assert export.main(["--ckpt", str(ckpt), "--out", str(out), "--attention", "--attention-class", spec]) \
            == (0 if exported else 2)
        if not exported:
            line = capsys.readouterr().err.strip().splitlines()[-1]
            assert "takes no mask" in line and "forward(x, mask)" in line
            continue
        texts = ["w1 alpha w2 beta w3", "beta w4"]
        session = onnxruntime.InferenceSession(str(out / "model.onnx"))
        encodings = Tokenizer.from_file(str(out / "tokenizer.json")).encode_batch(texts)
        feed = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64)}
        probabilities = session.run(["probabilities"], feed)[0]
        expected = [p.probabilities for p in classifier.predict(texts)]
        for got, want in zip(probabilities, expected):
            assert got.tolist() == pytest.approx([want[name] for name in classifier.label_names], abs=1e-5)


def test_the_log_lines_in_docs_are_what_training_prints(monkeypatch, caplog):
    import model.own_attention.layer

    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(model.own_attention.layer, "_said", set())
    config = NetworkConfig(attention="docs/examples/course_attention.py:SelfAttention", d_model=32, n_heads=2,
                           n_layers=2)
    with caplog.at_level("INFO", logger="model.own_attention"):
        from model.classifier import AttentionClassifier

        AttentionClassifier(config)  # smoke.yaml's sizes, two layers
    page = (ROOT / "docs" / "OWN_ATTENTION.md").read_text()
    lines = [f"{r.levelname} {r.name}: {r.message}" for r in caplog.records]
    assert len(lines) == 2 and all(line in page for line in lines)  # said once, not once per layer
