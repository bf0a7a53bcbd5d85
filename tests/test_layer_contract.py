"""The attention contract on one layer (monitor/layer_contract.py): a correct class of each style a user writes gets
no FAIL, and one mistake planted per check makes that check FAIL. The classes below are written the way tutorials
write them, not to fit the checks: the single-head class in the course's form (docs/examples), multi-head
with W_O and a padding mask, one fused qkv Linear, nn.MultiheadAttention wrapped."""

import math
import re
import shlex
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model.config import NetworkConfig
from model.errors import ConfigError
from model.kinds import ATTENTION_KINDS
from monitor import assert_attention_contract
from monitor.layer_contract import CHECKS, layer_contract, table

SEED_CLASS = Path(__file__).resolve().parents[1] / "docs" / "examples" / "course_attention.py"
TINY = NetworkConfig(window=2, global_tokens=1, projection_length=4, max_length=16)
KIND_SETTINGS = {name: kind.settings(TINY) for name, kind in ATTENTION_KINDS.items()}  # each kind's own arguments


class MultiHead(nn.Module):
    """Multi-head attention with W_O and a padding mask (True = padding), as the Annotated Transformer writes it."""

    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.w_q, self.w_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.w_v, self.w_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def heads(self, t):
        B, L, _ = t.shape
        return t.view(B, L, self.n_heads, self.d_k).transpose(1, 2)

    def scores(self, q, k):
        return q @ k.transpose(-2, -1) / math.sqrt(self.d_k)

    def softmax(self, scores):
        return scores.softmax(dim=-1)

    def forward(self, x, mask=None):
        B, L, D = x.shape
        q, k, v = self.heads(self.w_q(x)), self.heads(self.w_k(x)), self.heads(self.w_v(x))
        scores = self.scores(q, k)
        if mask is not None:
            scores = scores.masked_fill(mask[:, None, None, :], float("-inf"))
        weights = self.softmax(scores)
        out = self.dropout(weights) @ v
        return self.w_o(out.transpose(1, 2).reshape(B, L, D)), weights


class FusedQKV(nn.Module):
    """One fused qkv Linear, vit-pytorch style, with a 1/0 keep mask (Hugging Face's attention_mask)."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.scale = heads, (dim // heads) ** -0.5
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(dim, dim), nn.Dropout(0.0))

    def forward(self, x, attention_mask=None):
        B, L, _ = x.shape
        q, k, v = (t.view(B, L, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = q @ k.transpose(-1, -2) * self.scale
        if attention_mask is not None:
            dots = dots + (1.0 - attention_mask[:, None, None, :].float()) * -1e9
        attn = dots.softmax(dim=-1)
        return self.to_out((attn @ v).transpose(1, 2).reshape(B, L, -1)), attn


class Wrapped(nn.Module):
    """nn.MultiheadAttention wrapped, its key_padding_mask passed through, weights per head."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.attention = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

    def forward(self, x, key_padding_mask=None):
        return self.attention(x, x, x, key_padding_mask=key_padding_mask, need_weights=True,
                              average_attn_weights=False)


def verdicts(rows):
    return {row.check: row.verdict for row in rows}


def failed(rows):
    return [row.check for row in rows if row.verdict == "FAIL"]


@pytest.mark.parametrize("style", [MultiHead, FusedQKV, Wrapped])
def test_a_correct_class_of_each_style_gets_no_fail(style):
    rows = layer_contract(style, d_model=32, n_heads=4)
    assert failed(rows) == [], table(rows)
    assert verdicts(rows)["formula"] == "PASS"  # its projections were found and the formula recomputed
    assert verdicts(rows)["padding"] == "PASS"  # its mask convention was found by probing


def test_the_course_class_unchanged_gets_no_fail():
    rows = layer_contract(f"{SEED_CLASS}:SelfAttention", d_model=32, n_heads=4)
    assert failed(rows) == [], table(rows)
    assert verdicts(rows)["formula"] == "PASS"
    assert verdicts(rows)["padding"] == "NOTE"  # it takes no mask: said, not failed


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_every_built_in_kind_gets_no_fail(kind):
    rows = layer_contract(ATTENTION_KINDS[kind], d_model=32, n_heads=4, args=KIND_SETTINGS.get(kind))
    assert failed(rows) == [], table(rows)


class SoftmaxOverQueries(MultiHead):
    def softmax(self, scores):
        return scores.softmax(dim=-2)


class MaskOnQueries(MultiHead):
    def forward(self, x, mask=None):  # the mask broadcast along the queries: padded queries blocked, not keys
        B, L, D = x.shape
        q, k, v = self.heads(self.w_q(x)), self.heads(self.w_k(x)), self.heads(self.w_v(x))
        scores = self.scores(q, k)
        if mask is not None:
            scores = scores.masked_fill(mask[:, None, :, None], -1e9)
        weights = scores.softmax(dim=-1)
        return self.w_o((weights @ v).transpose(1, 2).reshape(B, L, D)), weights


class BatchMean(MultiHead):
    def heads(self, t):  # centred over the batch: a text's output depends on its neighbours
        return super().heads(t - t.mean(dim=0, keepdim=True))


class DropoutAlwaysOn(MultiHead):
    def softmax(self, scores):
        return F.dropout(scores.softmax(dim=-1), 0.1, training=True)


class PositionsInside(MultiHead):
    def __init__(self, d_model, n_heads):
        super().__init__(d_model, n_heads)
        self.position = nn.Parameter(torch.randn(64, d_model))

    def forward(self, x, mask=None):
        return super().forward(x + self.position[: x.shape[1]], mask)


class QueriesAsKeys(MultiHead):
    def scores(self, q, k):
        return q @ q.transpose(-2, -1) / math.sqrt(self.d_k)


class NoScaling(MultiHead):
    def scores(self, q, k):
        return q @ k.transpose(-2, -1)


class WrongBackward(torch.autograd.Function):
    """softmax with a hand-written backward that forgets the softmax's Jacobian."""

    @staticmethod
    def forward(ctx, scores):
        return scores.softmax(dim=-1)

    @staticmethod
    def backward(ctx, grad):
        return grad


class OwnBackward(MultiHead):
    def softmax(self, scores):
        return WrongBackward.apply(scores)


class KeysDetached(MultiHead):
    def scores(self, q, k):
        return q @ k.detach().transpose(-2, -1) / math.sqrt(self.d_k)


class HeadsNotMerged(MultiHead):
    def forward(self, x, mask=None):
        q, k, v = self.heads(self.w_q(x)), self.heads(self.w_k(x)), self.heads(self.w_v(x))
        weights = self.scores(q, k).softmax(dim=-1)
        return weights @ v, weights  # (B, H, L, d): the heads never merged back


class CausalOnlyInTraining(MultiHead):
    def scores(self, q, k):  # the look-ahead mask applied only while training: evaluation sees the future
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if self.training:
            L = scores.shape[-1]
            scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        return scores


class DiagonalBlocked(MultiHead):
    def scores(self, q, k):  # triu(diagonal=0): each token's own key blocked with the later ones
        L = q.shape[-2]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        return scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(0), -1e9)


class ExpOverSum(MultiHead):
    def softmax(self, scores):  # no row maximum subtracted: exp() overflows once scores grow
        return scores.exp() / scores.exp().sum(dim=-1, keepdim=True)


class KeyPaddingMeansKeep(MultiHead):
    def forward(self, x, key_padding_mask=None):  # PyTorch's name, read as True = keep
        return super().forward(x, None if key_padding_mask is None else ~key_padding_mask)


PLANTED = [  # (class, the check that must FAIL, d_model, heads)
    (HeadsNotMerged, "shapes", 32, 4),
    (SoftmaxOverQueries, "softmax-rows", 32, 4),
    (MaskOnQueries, "padding", 32, 4),
    (BatchMean, "neighbours", 32, 4),
    (DropoutAlwaysOn, "eval-steady", 32, 4),
    (PositionsInside, "permutation", 32, 4),
    (CausalOnlyInTraining, "train-eval", 32, 4),
    (DiagonalBlocked, "look-ahead", 32, 4),
    (ExpOverSum, "stability", 32, 4),
    (KeyPaddingMeansKeep, "mask-name", 32, 4),
    (QueriesAsKeys, "formula", 32, 4),
    (NoScaling, "scale", 64, 1),  # one head of 64: unscaled scores spread 8× what 1/√d_k gives
    (OwnBackward, "gradcheck", 32, 4),
    (KeysDetached, "gradient", 32, 4),
]


def test_every_check_has_a_planted_mistake():
    assert sorted(check for _, check, _, _ in PLANTED) == sorted(check.name for check in CHECKS)


@pytest.mark.parametrize("planted,check,d_model,heads", PLANTED, ids=[check for _, check, _, _ in PLANTED])
def test_a_planted_mistake_fails_its_check(planted, check, d_model, heads):
    rows = layer_contract(planted, d_model=d_model, n_heads=heads)
    assert verdicts(rows)[check] == "FAIL", table(rows)
    row = next(row for row in rows if row.check == check)
    assert row.evidence and row.fix  # the figures behind it, and what to try


def test_the_formula_names_the_stage_and_how():
    rows = {row.check: row for row in layer_contract(QueriesAsKeys, d_model=32, n_heads=4)}
    assert "scores" in rows["formula"].evidence and "Q Qᵀ" in rows["formula"].evidence
    rows = {row.check: row for row in layer_contract(NoScaling, d_model=64, n_heads=1)}
    assert "scores" in rows["formula"].evidence and "8 ×" in rows["formula"].evidence
    assert rows["scale"].figures["scale_factor"] == pytest.approx(8.0, rel=1e-3)


def test_unnamed_projections_are_a_note_until_mapped():
    class Unnamed(MultiHead):
        def __init__(self, d_model, n_heads):
            super().__init__(d_model, n_heads)
            self.a, self.b, self.c, self.d = self.w_q, self.w_k, self.w_v, self.w_o
            del self.w_q, self.w_k, self.w_v, self.w_o

        def forward(self, x, mask=None):
            self.w_q, self.w_k, self.w_v, self.w_o = self.a, self.b, self.c, self.d
            return super().forward(x, mask)

    rows = {row.check: row for row in layer_contract(Unnamed, d_model=32, n_heads=4)}
    assert rows["formula"].verdict == "NOTE" and "--map" in rows["formula"].fix
    mapped = layer_contract(Unnamed, d_model=32, n_heads=4, mapping={"q": "a", "k": "b", "v": "c", "o": "d"})
    assert verdicts(mapped)["formula"] == "PASS"


def test_assert_attention_contract_raises_with_the_table_on_a_fail():
    torch.manual_seed(0)
    assert_attention_contract(MultiHead(32, 4))  # a correct instance passes ...
    with pytest.raises(AssertionError, match="formula .*FAIL"):
        assert_attention_contract(QueriesAsKeys(32, 4))  # ... a broken one raises the table


def test_a_class_that_cannot_be_built_is_bad_input():
    with pytest.raises(ConfigError, match="needs 'window'"):
        class NeedsWindow(MultiHead):
            def __init__(self, d_model, n_heads, window):
                super().__init__(d_model, n_heads)

        layer_contract(NeedsWindow, d_model=32, n_heads=4)


BROKEN_FILE = '''
import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, d_model, d_k):
        super().__init__()
        self.W_Q = nn.Linear(d_model, d_k, bias=False)
        self.W_K = nn.Linear(d_model, d_k, bias=False)
        self.W_V = nn.Linear(d_model, d_k, bias=False)

    def forward(self, X):
        Q, K, V = self.W_Q(X), self.W_K(X), self.W_V(X)
        weights = torch.softmax(Q @ K.transpose(-2, -1), dim=-1)  # the 1/sqrt(d_k) forgotten
        return weights @ V, weights
'''


def run_diagnose(capsys, *argv):
    import diagnose

    code = diagnose.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_diagnose_attention_exit_codes_and_table(tmp_path, capsys):
    code, out, _ = run_diagnose(capsys, "--attention", f"{SEED_CLASS}:SelfAttention")
    assert code == 0 and "0 FAIL" in out and "formula       PASS" in out
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN_FILE)
    code, out, _ = run_diagnose(capsys, "--attention", f"{broken}:Attention", "--d-model", "64", "--heads", "1")
    assert code == 1 and "scale         FAIL" in out and "8 × what 1/√d_k gives" in out


@pytest.mark.parametrize("argv,message", [
    (["--attention", "missing.py:Attention"], "file missing.py not found"),
    (["--attention", "BROKEN:Other"], "no class Other"),
    (["--attention", "BROKEN:Attention", "--map", "q=W_Q"], "name q, k and v"),
    (["--attention", "BROKEN:Attention", "--map", "q=W_Q,k=nowhere,v=W_V"], "no attribute 'nowhere'"),
    (["--attention", "BROKEN:Attention", "--args", "{oops"], "not JSON"),
    (["--attention", "BROKEN:Attention", "--args", '{"window": 8}'], "takes no such argument"),
])
def test_diagnose_attention_bad_input_is_one_line_and_exit_2(tmp_path, capsys, argv, message):
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN_FILE)
    argv = [arg.replace("BROKEN", str(broken)) for arg in argv]
    try:
        code, _, err = run_diagnose(capsys, *argv)
    except SystemExit as e:  # argparse's own errors
        code, err = e.code, capsys.readouterr().err
    assert code == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


PAGE = Path(__file__).resolve().parents[1] / "docs" / "OWN_ATTENTION.md"


def page_commands():
    """(argv, printed) of every `$ python diagnose.py …` block of docs/OWN_ATTENTION.md."""
    blocks = re.findall(r"```console\n\$ python diagnose.py (.*?)\n(.*?)```", PAGE.read_text(), flags=re.S)
    return [(shlex.split(command), printed) for command, printed in blocks]


def test_the_page_shows_five_commands():
    published = "bench/catalogue/user_attention/published/"
    assert [argv[1] for argv, _ in page_commands()] == [
        f"{published}mingpt.py:CausalSelfAttention", f"{published}mha_implementations.py:MHAPyTorchScaledDotProduct",
        "docs/examples/course_attention.py:SelfAttention", "docs/examples/my_attention.py:MyAttention",
        "docs/examples/my_attention_mistake.py:MyAttention"]


@pytest.mark.parametrize("argv,printed", page_commands(), ids=lambda value: "" if isinstance(value, str) else
                         value[1].split("/")[-1])
def test_every_output_on_the_page_is_what_its_command_prints(argv, printed, capsys, monkeypatch):
    monkeypatch.chdir(PAGE.parents[1])
    _, out, _ = run_diagnose(capsys, *argv)
    assert out == printed


@pytest.mark.parametrize("accuracy,verdict", [(0.95, "PASS"), (0.55, "FAIL")])
def test_learn_compares_with_the_built_in_layer_and_names_the_contracts_findings(accuracy, verdict, tmp_path,
                                                                                 monkeypatch):
    import monitor.learning

    trained = []

    def synthetic_accuracy(attention, attention_args=None, epochs=monitor.learning.EPOCHS, seed=0, **network):
        trained.append((attention, network))
        return (accuracy, {"n_heads": 1, "d_head": 16}) if attention != "full" else (0.96, {})

    monkeypatch.setattr(monitor.learning, "synthetic_accuracy", synthetic_accuracy)
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN_FILE)
    rows = layer_contract(f"{broken}:Attention", d_model=64, n_heads=1, learn=True)
    # both trained, the user's class by its spec, the built-in layer in the class's shape
    assert trained == [(f"{broken}:Attention", {}), ("full", {"n_heads": 1, "d_head": 16})]
    learn = rows[-1]
    assert learn.check == "learn" and learn.verdict == verdict and "1 head(s) of 16" in learn.evidence
    if verdict == "FAIL":
        assert learn.evidence.startswith("not-learning") and "formula, scale" in learn.cause
    assert "learn" not in verdicts(layer_contract(f"{broken}:Attention", d_model=64, n_heads=1))  # only when asked


def test_the_held_out_bench_judges_a_class_by_the_property_its_mistake_breaks():
    from bench.catalogue.proof import judge
    from bench.catalogue.scores import class_summary
    from bench.catalogue.user_attention.catalogue import CATALOGUE

    entries = {entry["file"]: entry for entry in CATALOGUE}
    results = [judge(entries[name]) for name in ("course_self_attention.py", "course_no_scale.py")]
    assert results[0]["failed"] == [] and results[1]["right"] == ["formula", "scale"]
    totals = class_summary(results)
    assert (totals["buggy_right_check"], totals["correct_failed"]) == (1, 0)


class NeedsMaskFilledWithZero(nn.Module):
    """forward must be given its mask, and it fills blocked scores with 0 instead of a huge negative number: no
    convention keeps padding out, which is the padding check's finding, not a shape problem."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.w_q, self.w_k, self.w_v = (nn.Linear(d_model, d_model, bias=False) for _ in range(3))

    def forward(self, x, mask):
        scores = self.w_q(x) @ self.w_k(x).transpose(-2, -1) / math.sqrt(x.shape[-1])
        weights = scores.masked_fill(mask[:, None, :] == 0, 0).softmax(-1)
        return weights @ self.w_v(x), weights


def test_a_required_mask_no_convention_keeps_out_is_a_padding_fail():
    verdicts = {row.check: row.verdict for row in layer_contract(NeedsMaskFilledWithZero, d_model=16, n_heads=2)}
    assert verdicts["padding"] == "FAIL" and verdicts["shapes"] == "NOTE"


def test_a_new_family_is_one_unit_whose_contract_judges_its_checks(monkeypatch):
    """A family registered as one FamilyUnit (monitor/layer_family.py) judges the checks its contract names for the
    layers that belong to it, before the checks' own judges; the others keep theirs. The causal family judges the
    look-ahead check: a causal layer's row says so."""
    from monitor.layer_family import FAMILIES, FamilyUnit
    from monitor.layer_probe import Outcome

    said = Outcome("NOTE", "judged by the family of single-head layers")
    single = FamilyUnit("single head", lambda probe: probe.layer.n_heads == 1, {"softmax-rows": lambda probe: said})
    monkeypatch.setattr("monitor.layer_family.FAMILIES", [*FAMILIES, single])
    one, two = (layer_contract(MultiHead, d_model=16, n_heads=heads) for heads in (1, 2))
    assert next(row for row in one if row.check == "softmax-rows").evidence == said.evidence
    assert next(row for row in two if row.check == "softmax-rows").verdict == "PASS"
    causal = layer_contract(ATTENTION_KINDS["full"](d_model=16, n_heads=2, causal=True))
    assert next(row for row in causal if row.check == "look-ahead").evidence.startswith("causal: earlier outputs")
