"""The registry of attention kinds (model/kinds.py): a new kind plugs in with one registry line. The tiny kind of
tests/conftest.py, "every query sees only itself and the first token", is registered the way a new module would be
and goes through every test that takes the `registered_kind` fixture: the formula reaching training, prediction and
the monitor (test_formula.py), gradients and padding (test_long_attention.py, test_classifier.py) and ONNX export
(test_export.py). Here: what is particular to it."""

import ast
import math

import pytest
import torch

from conftest import PLUGGED_IN as NAME
from conftest import ROOT, SelfAndFirstAttention, padding_mask, registry_with_plugged_in
from model.attention import MultiHeadSelfAttention
from model.classifier import AttentionClassifier
from model.config import ConfigError, NetworkConfig
from model.kinds import ATTENTION_KINDS
from monitor.health import AttentionHealth

LENGTHS = [11, 7, 3]


@pytest.fixture
def registered():
    with registry_with_plugged_in():
        yield


def test_every_kind_is_an_attention_layer_that_says_what_a_query_sees_in_its_own_words():
    assert all(issubclass(kind, MultiHeadSelfAttention) for kind in ATTENTION_KINDS.values())
    # --help lists each kind by its summary: a kind that forgot its own inherits full attention's and would read as it
    assert len({kind.summary for kind in ATTENTION_KINDS.values()}) == len(ATTENTION_KINDS)


def test_an_unregistered_kind_is_refused_and_a_registered_one_is_taken(registered, monkeypatch):
    assert NetworkConfig(attention=NAME).attention == NAME
    monkeypatch.delitem(ATTENTION_KINDS, NAME)
    with pytest.raises(ConfigError, match=f"attention must be one of full, .*got '{NAME}'"):
        NetworkConfig(attention=NAME)


def test_the_new_kind_sees_only_itself_and_the_first_token(registered):
    config = NetworkConfig(vocab_size=30, d_model=16, n_heads=2, max_length=8, attention=NAME)
    model = AttentionClassifier(config).eval()
    assert isinstance(model.blocks[0].attention, SelfAndFirstAttention)
    mask = padding_mask([8, 5, 1], L=8)
    (attention,) = model(torch.randint(1, 30, (3, 8)), mask, need_weights=True).attention
    seen = torch.eye(8, dtype=torch.bool)
    seen[:, 0] = True
    assert (attention.weights[:, :, ~seen] == 0).all()
    real = attention.weights[:2, :, 1:5]  # queries 1..4 of the two texts of 5 tokens or more: two keys each
    assert (real[..., 0] > 0).all() and (real[..., 1:5].diagonal(0, -2, -1) > 0).all()


def test_the_health_figures_count_the_keys_each_query_sees(registered):
    """W_Q = 0: each row is uniform over the keys it may see (itself and the first token), so the normalized
    entropy is exactly 1; the first token sees one key only and is not counted."""

    config = NetworkConfig(vocab_size=30, d_model=16, n_heads=2, max_length=11, attention=NAME)
    model = AttentionClassifier(config).eval()
    torch.nn.init.zeros_(model.blocks[0].attention.w_q.weight)
    mask = padding_mask(LENGTHS, L=11)
    attention = model(torch.randint(1, 30, mask.shape), mask, need_weights=True).attention
    health = AttentionHealth()
    health.update(attention, mask)
    figures = health.compute()
    torch.testing.assert_close(figures.entropy, torch.ones_like(figures.entropy))
    assert figures.rows == sum(n - 1 for n in LENGTHS)


def test_a_users_class_is_found_by_the_registry_and_answers_as_every_kind():
    """A spec finds its kind where a name finds a kind of the product (model/kinds.py), and the questions the project
    asks of a kind (model/kind.py) get the user's class's answers, not a branch somewhere else."""
    from model.kinds import attention_kind, find_kind
    from model.own_attention import OwnAttention

    spec = f"{ROOT / 'docs' / 'examples' / 'course_attention.py'}:SelfAttention"
    assert find_kind(spec) is OwnAttention and find_kind("full") is MultiHeadSelfAttention
    assert find_kind("no-such-kind") is None and find_kind(None) is None
    assert (OwnAttention.names_code, OwnAttention.heads_cut) == (True, False)
    assert not any(kind.names_code for kind in ATTENTION_KINDS.values())
    config = NetworkConfig(attention=spec, d_model=16, n_heads=2)
    assert set(config.attention_source) == {"spec", "path", "sha256"}  # recorded by the kind's source()
    layer = attention_kind(spec).build(config)
    assert isinstance(layer, OwnAttention) and layer.inner is layer.user and layer.mask_convention is not None
    built_in = attention_kind("full").build(NetworkConfig(d_model=16, n_heads=2))
    assert built_in.inner is built_in and built_in.mask_convention is None and built_in.scale == 1 / math.sqrt(8)


def test_nothing_outside_the_registry_and_the_home_asks_whether_a_kind_is_a_users_class():
    """Only model/kinds.py (the registry), the home (model/own_attention/) and the doctor's builder of a class it is
    handed (monitor/layer_contract.py) name OwnAttention or is_class_spec; no product file asks isinstance of it."""
    named = {}
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(("tests/", "model/own_attention/", ".venv/")) or "/." in f"/{relative}":
            continue
        nodes = list(ast.walk(ast.parse(path.read_text(encoding="utf-8"))))
        names = {node.id for node in nodes if isinstance(node, ast.Name)}
        names |= {alias.name for node in nodes if isinstance(node, ast.ImportFrom) for alias in node.names}
        if names & {"OwnAttention", "is_class_spec"}:
            named[relative] = sorted(names & {"OwnAttention", "is_class_spec"})
    assert named["model/kinds.py"] == ["OwnAttention"]  # the scan sees the registry's own entry
    assert set(named) <= {"model/kinds.py", "monitor/layer_contract.py"}, named
