"""Every list of attention kinds comes from the registry (model/kinds.py; the README's table and the doctor's table
of planted bugs are generated from it: tests/test_docs.py), and a kind written here, one class and one registry line,
shows up in config validation, --help, the bugs table and the planted bugs' kinds with nothing else edited."""

import ast
from types import SimpleNamespace

import pytest
import torch

import train
from bench.catalogue import bugs
from bench.catalogue.bugs import BUGS, Plant
from conftest import ROOT
from model.attention import MultiHeadSelfAttention, attention_mask
from model.classifier import AttentionClassifier
from model.config import ConfigError, NetworkConfig
from model.kinds import ATTENTION_KINDS, kinds_help
from monitor.views import token_window

STRIDED = "strided"


class StridedSelfAttention(MultiHeadSelfAttention):
    """Each query sees the keys a multiple of `window` tokens away (the strided pattern of Child et al. 2019)."""

    summary = "the keys a multiple of `window` tokens away, O(L²/w)"
    least = {"window": 1}

    def __init__(self, *, stride: int, **kwargs):
        super().__init__(**kwargs)
        self.stride = stride

    @classmethod
    def check(cls, config) -> None:
        if config.window > config.max_length:
            raise ConfigError(f"window {config.window} is larger than max_length {config.max_length}: no stride")

    @classmethod
    def settings(cls, config) -> dict:
        return {"stride": config.window}  # the window setting, read as the stride

    def mask(self, key_padding_mask, L, device=None):
        distance = torch.arange(L, device=device)[:, None] - torch.arange(L, device=device)  # (L, L) query − key
        blocked = (distance % self.stride != 0)[None, None]  # (1, 1, L, L)
        rest = attention_mask(key_padding_mask, self.look_ahead, L, device)  # padding and the look-ahead mask
        return blocked if rest is None else blocked | rest


@pytest.fixture
def strided(monkeypatch):
    monkeypatch.setitem(ATTENTION_KINDS, STRIDED, StridedSelfAttention)  # the one line a new kind adds
    return STRIDED


def bugs_table(capsys) -> str:
    bugs.main([])
    return capsys.readouterr().out


def test_a_kind_registered_later_is_validated_by_its_own_rules(strided):
    assert NetworkConfig(attention=strided, max_length=8, window=2).attention == strided
    with pytest.raises(ConfigError, match="window 9 is larger than max_length 8: no stride"):
        NetworkConfig(attention=strided, max_length=8, window=9)
    with pytest.raises(ConfigError, match="attention must be one of .*strided"):
        NetworkConfig(attention="strided-typo")


def test_a_kind_registered_later_is_in_the_help_and_the_bugs_table(strided, capsys):
    assert f'"{strided}" {StridedSelfAttention.summary}' in kinds_help()
    look_ahead = next(line for line in bugs_table(capsys).splitlines() if line.startswith("| look-ahead |"))
    assert strided in look_ahead.split(" | ")[3].split(", ")


@pytest.mark.slow
def test_train_help_lists_a_kind_registered_later(strided, capsys):
    with pytest.raises(SystemExit):
        train.main(["fit", "--help"])
    assert f'"{strided}" the keys a multiple' in " ".join(capsys.readouterr().out.split())


def test_the_planted_look_ahead_reaches_a_kind_registered_later(strided):
    """The look-ahead bug plants itself through the kind's own rule (its layers' look_ahead), not by its name."""
    assert strided in BUGS["look-ahead"].kinds and strided in BUGS["padding-ignored"].kinds
    config = NetworkConfig(vocab_size=30, max_length=8, d_model=16, n_heads=2, attention=strided, window=2,
                           dropout=0.0, embedding_dropout=0.0)
    ids = torch.randint(4, 30, (2, 8), generator=torch.Generator().manual_seed(1))

    def later_weight(bug: str | None) -> float:
        plant = Plant()
        if bug is not None:
            BUGS[bug].plant(plant)
        torch.manual_seed(0)
        network = AttentionClassifier(config).eval()
        plant.edit(SimpleNamespace(model=network, online_model=network, hparams=SimpleNamespace(lr=0.001)))
        with torch.no_grad(), plant.applied():
            weights = token_window(network(ids, need_weights=True).attention[0], 0, 8)  # (B, H, L, L)
        return float(weights.triu(diagonal=1).sum())

    assert later_weight(None) > 0.1
    assert later_weight("look-ahead") == 0.0


def kind_names_outside_the_registry() -> list[str]:
    """Places that name attention kinds by hand: in the product (not the tests) a comparison with a kind's name
    (`config.attention == "full"`); in the product and the tests a literal list, tuple, set or dict keyed by two or
    more of them (a test of every kind, or of a family, reads the registry). A kind's rules are asked of its class."""
    allowed = {"model/kinds.py", "model/attention.py", "model/long_attention.py"}  # the registry and the kinds
    names = set(ATTENTION_KINDS)
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative in allowed or relative.startswith(".venv/") or "/." in f"/{relative}":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare) and not relative.startswith("tests/"):
                named = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)
                         and c.value in names]
            elif isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
                elements = node.keys if isinstance(node, ast.Dict) else node.elts
                named = [e.value for e in elements if isinstance(e, ast.Constant) and e.value in names]
                named = named if len(named) >= 2 else []
            else:
                continue
            if named:
                found.append(f"{relative}:{node.lineno} {named}")
    return found


def test_no_kind_is_named_outside_the_registry():
    assert kind_names_outside_the_registry() == []
