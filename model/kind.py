"""The one interface of an attention kind: every question the project asks of a kind, answered at the defaults of the
built-in kinds (model/attention.py, model/long_attention.py). A user's class answers the same questions through its
adapter (model/own_attention/layer.py). The config, the classifier, the monitor, the doctor, prediction, export and
prune.py ask the kind (model/kinds.py finds it for a setting) and never whether it is a user's class.

Asked of the kind, with a config (class methods and attributes):
    names(setting)            whether a setting names it by its form (a user's class: "path/to/file.py:ClassName")
    source(config)            what the config records of the kind's code (its attention_source): None for a kind of
                              the product, which takes no attention_args
    check(config)             its own rules on the settings: ConfigError, one line
    settings(config)          its constructor arguments beyond those every kind takes
    extra_parameters(config)  weights one layer has beyond W_Q, W_K, W_V, W_O (the config's size bound)
    build(config, n_heads)    one layer, as a Block holds it
    order_blind(config)       whether, without positions, the output ignores the order of the tokens after the first
    keys_are_tokens, length_cap, least, names_code, heads_cut   (below, each with what it means)

Asked of a layer:
    forward, forward_packed, n_heads, head_gate, gates_heads   what the classifier, heatmaps and head importance call
    look_ahead, causal        later keys blocked; the look-ahead the kind asks for (a planted bug sets look_ahead only)
    takes_mask, runs_by_length, convention, mask_convention     how it takes the padding mask
    weights_from, weights_not_used                              how it hands out its weights
    scale, reference_keys_values, positions_inside, keys_by_position   what its definition says, for the doctor
    inner                     the module whose code computes the attention
    problem_at_length(length) what goes wrong when it reads a text of `length` tokens
"""

from types import SimpleNamespace

from model.errors import ConfigError


class Kind:
    """An attention kind's answers; a layer of it is also an nn.Module (the kind's class comes first in its bases)."""

    keys_are_tokens = True  # each key is a token of the text, so masks reach it (linformer's projections: False)
    length_cap = 256  # the longest texts data.max_length reads when left unset: full attention costs L²
    least: dict[str, int] = {}  # the least value of each NetworkConfig setting the kind reads (settings())
    names_code = False  # the setting names code the user must name on every command that loads it (a user's class)
    heads_cut = True  # prune.py cuts a head out of a checkpoint: its rows of W_Q, W_K, W_V and columns of W_O
    gates_heads = True  # head_gate reaches each head (a layer whose heads cannot be told apart: False)

    @classmethod
    def names(cls, setting) -> bool:
        """Whether an `attention` setting names this kind by its form; a kind of the product is found by the name
        model/kinds.py registers it under."""
        return False

    @classmethod
    def source(cls, config) -> dict | None:
        """The record of the kind's code the config keeps (attention_source); ConfigError (one line) for a setting
        only a user's class takes. A kind of the product has no code to record."""
        if config.attention_args is not None or config.attention_source is not None:
            raise ConfigError(f"attention_args and attention_source apply to a user's class "
                              f"(attention: path/to/file.py:ClassName), not to attention {config.attention}")
        return None

    @classmethod
    def check(cls, config) -> None:
        """Raises ConfigError (one line) when this kind cannot work with the config's settings; full takes any."""

    @classmethod
    def settings(cls, config) -> dict:
        """The constructor arguments of this kind beyond those every kind takes, read from the config."""
        return {}

    @classmethod
    def extra_parameters(cls, config) -> int:
        """Weights one layer of this kind has beyond W_Q, W_K, W_V, W_O (for the config's size bound)."""
        return 0

    @classmethod
    def build(cls, config, n_heads: int | None = None):
        """One layer with n_heads heads (default config.n_heads; fewer in a pruned layer) of config.head_size each."""
        return cls(d_model=config.d_model, n_heads=n_heads or config.n_heads, d_head=config.head_size,
                   dropout=config.attention_dropout, bias=config.bias, scale=config.scale, causal=config.causal,
                   kernel=config.attention_kernel, **cls.settings(config))

    @classmethod
    def order_blind(cls, config) -> bool:
        """Whether, without positions, the output ignores the order of the tokens after the first (the shuffled
        tokens check, monitor/checks.py): every key seen alike; the look-ahead mask makes order matter."""
        return not config.causal

    # ---- a layer's answers --------------------------------------------------------------------------------------
    causal = False  # the look-ahead mask its kind asks for (a setting; found by probing a user's class)
    takes_mask = True  # forward takes key_padding_mask (B, L), bool, True = padding
    runs_by_length = False  # True: it takes no mask, so a padded batch is run text length by text length
    convention = "key_padding_mask (B, L), bool True = padding"  # how it takes the mask, in words
    mask_convention = None  # the convention found by probing a user's class (None: the classifier's own)
    weights_from: str | None = "returned"  # how its weights reach the monitor (None: they cannot be seen)
    weights_not_used = None  # a mask convention under which the weights handed out are not those used (found)
    scale: float | None = None  # what multiplies Q Kᵀ by its definition (None: no definition; read from its scores)
    reference_keys_values = None  # its definition's keys and values, for the doctor's reference (None: none)
    positions_inside: str | None = "none"  # position terms inside the layer by its definition (None: found by probing)

    @property
    def keys_by_position(self) -> bool:
        """Whether its definition makes the keys a query sees depend on where the tokens are (a window, the look-ahead
        mask): the permutation check then does not apply."""
        return not self.order_blind(SimpleNamespace(causal=self.causal))

    @property
    def inner(self):
        """The module whose code computes the attention, whose projections and buffers the doctor reads."""
        return self

    def problem_at_length(self, length: int) -> str | None:
        """What goes wrong when the layer reads a text of `length` tokens, in one line; None. A kind of the product
        reads any length its settings allow (the config checks them)."""
        return None


def asks_look_ahead(network) -> bool:
    """Whether a layer of the network asks for the look-ahead mask: the config's causal, or a user's class found
    causal by probing. A look-ahead nobody asked for (a layer's look_ahead alone) is a bug the monitor reports."""
    return any(isinstance(module, Kind) and module.causal for module in network.modules())
