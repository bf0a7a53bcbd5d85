"""The attention kinds by name: the one place a kind is named (as transformers' BERT_SELF_ATTENTION_CLASSES).

Each class carries what the rest of the project asks of a kind: `check(config)` (its own rules on the settings,
ConfigError on a bad one), `settings(config)` (its constructor arguments), `extra_parameters(config)`,
`keys_are_tokens` (whether masks reach its keys), `length_cap` (how long data.max_length may be when left unset),
`order_blind(config)` (whether the shuffled-tokens check applies) and, on each layer, `look_ahead` (later keys
blocked). What a layer hands out with need_weights says its own key layout (model/attention.py's AttentionWeights).
The config, the classifier, the monitor, prediction, export, the benches and the tests look kinds up here and never
ask a kind's name. A new kind is a MultiHeadSelfAttention subclass and one line below.
"""

from model.attention import MultiHeadSelfAttention
from model.long_attention import LinformerSelfAttention, LocalSelfAttention, SparseSelfAttention
from model.own_attention import OwnAttention, is_class_spec

ATTENTION_KINDS: dict[str, type[MultiHeadSelfAttention]] = {
    "full": MultiHeadSelfAttention,
    "local": LocalSelfAttention,
    "linformer": LinformerSelfAttention,
    "sparse": SparseSelfAttention,
}


DEFAULT_KIND = "full"  # NetworkConfig's default, and the baseline the cheaper kinds are measured against
AUTO_KINDS = ("full", "local")  # what attention "auto" stands for on short and on long texts (model/config.py)


def attention_kind(name: str) -> type:
    """The class whose rules apply to an `attention` setting: a registered kind by name, or OwnAttention for a
    user's class ("path/to/file.py:ClassName", model/own_attention/layer.py). KeyError for anything else."""
    if name in ATTENTION_KINDS:
        return ATTENTION_KINDS[name]
    if is_class_spec(name):
        return OwnAttention
    raise KeyError(name)


def kinds_help() -> str:
    """Every registered kind with what a query sees, for --help (train.py, the benches)."""
    return "; ".join([*(f'"{name}" {kind.summary}' for name, kind in ATTENTION_KINDS.items()),
                      f"or {OwnAttention.summary}"])
