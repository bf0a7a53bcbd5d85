"""The attention kinds by name: the one place a kind is named (as transformers' BERT_SELF_ATTENTION_CLASSES).

Each kind answers what the rest of the project asks of it through one interface (model/kind.py): its rules on the
settings, the layer it builds, what its layers hand out (model/attention.py's AttentionWeights says its key layout)
and what the doctor reads. The config, the classifier, the monitor, prediction, export, prune.py, the benches and the
tests look kinds up here and never ask a kind's name, nor whether it is a user's class. A new kind is a
MultiHeadSelfAttention subclass and one line below.

A user's own class is the kind OwnAttention (model/own_attention/): a setting it names ("path/to/file.py:ClassName")
finds it here, as a name finds a kind of the product.
"""

from model.attention import MultiHeadSelfAttention
from model.kind import Kind
from model.long_attention import LinformerSelfAttention, LocalSelfAttention, SparseSelfAttention
from model.own_attention import OwnAttention

ATTENTION_KINDS: dict[str, type[MultiHeadSelfAttention]] = {
    "full": MultiHeadSelfAttention,
    "local": LocalSelfAttention,
    "linformer": LinformerSelfAttention,
    "sparse": SparseSelfAttention,
}
NAMED_KINDS: tuple[type[Kind], ...] = (OwnAttention,)  # kinds a setting names by its form rather than by a name


DEFAULT_KIND = "full"  # NetworkConfig's default, and the baseline the cheaper kinds are measured against
AUTO_KINDS = ("full", "local")  # what attention "auto" stands for on short and on long texts (model/config.py)


def find_kind(setting) -> type[Kind] | None:
    """The kind whose rules apply to an `attention` setting: a registered kind by name, or the kind whose settings
    have the setting's form (a user's class, "path/to/file.py:ClassName"); None for anything else."""
    if isinstance(setting, str) and setting in ATTENTION_KINDS:
        return ATTENTION_KINDS[setting]
    return next((kind for kind in NAMED_KINDS if kind.names(setting)), None)


def attention_kind(setting) -> type[Kind]:
    """find_kind, KeyError for a setting no kind answers."""
    kind = find_kind(setting)
    if kind is None:
        raise KeyError(setting)
    return kind


def kinds_help() -> str:
    """Every registered kind with what a query sees, for --help (train.py, the benches)."""
    return "; ".join([*(f'"{name}" {kind.summary}' for name, kind in ATTENTION_KINDS.items()),
                      *(f"or {kind.summary}" for kind in NAMED_KINDS)])
