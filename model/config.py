"""NetworkConfig: every setting of the network, in one place.

`AttentionClassifier(config)` is built from it; the Lightning module takes it as its `network` argument (so a
config file says `model: network: d_model: 64` and the command line `--model.network.d_model 64`); the
checkpoint stores it whole as a dict under hyper_parameters["network"]; inference, benchmarks and tests rebuild
the network with `NetworkConfig(**that_dict)`. A new option is a new field here and nothing else.
"""

from dataclasses import asdict, dataclass, fields, replace

from model.errors import ConfigError, check_whole_number
from model.kind import Kind
from model.kinds import ATTENTION_KINDS, AUTO_KINDS, DEFAULT_KIND, attention_kind, find_kind

POOLINGS = ("mean", "max", "first", "attention")
POSITIONS = ("learned", "sinusoidal", "none")
KERNELS = ("manual", "fused")
NGRAM_WEIGHTINGS = ("tfidf", "nb")  # the fitted n-gram bag's feature weights (training/ngram_fit.py)
AUTO = "auto"  # attention: full up to FULL_ATTENTION_MAX_LENGTH tokens, local beyond (NetworkConfig.resolved)
# "auto" reads texts up to the first kind's length cap with it (full costs L²), longer ones with the second
FULL_ATTENTION_MAX_LENGTH, LONG_MAX_LENGTH = (ATTENTION_KINDS[kind].length_cap for kind in AUTO_KINDS)


# Upper bounds on what sizes memory, checked before anything is built (a typo must not allocate 240 GB):
MAX_LENGTH = 65536  # tokens per text (position table rows; attention costs grow with it)
MAX_PARAMETERS = 1_000_000_000  # weights of the whole network (4 GB in float32), from vocab_size, d_model, d_ff, ...


@dataclass(frozen=True)
class NetworkConfig:
    """The shape and behaviour of the network (model/classifier.py).

    Args:
        vocab_size: embedding rows; train.py sets it from the data (the tokenizer never exceeds it).
        num_classes: outputs of the linear head; train.py sets it from the data's label names.
        max_length: longest input in tokens (rows of the position table); train.py links it to data.max_length.
        d_model: width of the embeddings and of every layer.
        n_heads: attention heads per layer.
        d_head: size of each head; default d_model // n_heads.
        n_layers: attention blocks stacked.
        d_ff: hidden width of the position-wise feed-forward after attention; 0 leaves it out.
        dropout: after attention and feed-forward, before each residual add.
        embedding_dropout: on token + position embeddings.
        attention_dropout: on the attention weights.
        head_dropout: on the pooled sentence vector, before the linear head.
        embedding_std: standard deviation of the token and learned position embeddings at initialisation
            (1.0 is PyTorch's N(0, 1)). Smaller starting vectors let the few updates a rare word gets outweigh its
            random start (with embedding_norm, so attention still sees unit-scale vectors).
        embedding_norm: a LayerNorm on token + position embeddings before the first block (as in BERT).
        pooling: how token vectors become one sentence vector: mean, max, first or attention.
        positions: position vectors added to the token embeddings: learned, sinusoidal or none.
        bias: biases in W_Q, W_K, W_V, W_O (the textbook formula has none).
        scale: multiplies Q·Kᵀ; default 1/sqrt(d_head). Try 1.0 or 0.001 to see attention break.
        causal: add the look-ahead mask (each token sees only itself and earlier tokens).
        attention_kernel: "manual" (default) computes softmax(Q Kᵀ · scale) V with the lines in
            model/attention.py; "fused" hands the same formula to torch's scaled_dot_product_attention (faster,
            proven equal by tests/test_attention.py), except where weights are asked for (monitor, heatmaps,
            predict.py --attention), which always use the written lines. Applies to attention: full only.
        attention: which keys each token attends to: a kind of model/kinds.py (README "Long texts"), "full"
            by default, or "auto", full attention when max_length is at most 256 tokens and local beyond (the
            generic default, configs/default.yaml: with data.max_length unset, the data then read whole long
            texts, see data.attention); or a user's own class, "path/to/file.py:ClassName",
            "package.module:ClassName" or "package.module.ClassName", unchanged (docs/OWN_ATTENTION.md).
        attention_args: a user's class: constructor arguments no network setting fills, e.g. {"d_k": 128}
            (d_model, n_heads and the head size fill the arguments named like them).
        attention_source: a user's class: recorded by the product, leave unset: {"spec", "path", "sha256"} of the
            class's file. A checkpoint's record is data: the network is built only with the class the user names
            on the command that loads it, its file's hash equal to the recorded one (model/own_attention/naming.py).
        window: local and sparse: how many tokens on each side a token sees (also the block size they are
            computed in); at most max_length (a block costs w × 3w scores whatever the text's length).
        projection_length: linformer: k, the rows keys and values are projected to (at most max_length).
        global_tokens: sparse: the first this many tokens are global (at most max_length; 0 is plain local).
        ngrams: beside the attention path, a bag of the text's distinct n-grams of 1..ngrams tokens whose learned
            votes join the head's logits (model/ngrams.py: NBSVM's linear model on binary n-gram features, the
            n-grams hashed from the token ids inside the network); 0 (default) leaves the branch out.
        ngram_buckets: rows the n-grams of 2 or more tokens are hashed into (unigrams have a row each).
        ngram_fitted: the bag is a logistic regression on the text's weighted n-grams (unit length, as the
            TF-IDF + LR peer weighs them), fitted on the training texts before the first step and not trained after
            (training/ngram_fit.py); the attention path learns what it gets wrong, from its out-of-fold logits
            (stacking). False (default): learned votes on binary n-grams.
        ngram_weighting: the fitted bag's feature weights. "tfidf" (default): idf, C = 4, the TF-IDF + LR peer's;
            "nb": idf times the naive-Bayes log-count ratio of the two classes, C = 16 (NBSVM's weights; two classes,
            one label a text): the bag alone is better on validation, the whole model only on IMDB
            (docs/RESULTS.md "Naive-Bayes weights").
        layer_heads: heads kept in each layer after pruning (prune.py), one count per layer, each
            1..n_heads; null (default) is n_heads in every layer. Each head keeps its size, head_size.
    """

    vocab_size: int = 8000
    num_classes: int = 2
    max_length: int = 128
    d_model: int = 128
    n_heads: int = 4
    d_head: int | None = None
    n_layers: int = 1
    d_ff: int = 0
    dropout: float = 0.1
    embedding_dropout: float = 0.1
    attention_dropout: float = 0.0
    head_dropout: float = 0.0
    embedding_std: float = 1.0
    embedding_norm: bool = False
    pooling: str = "mean"
    positions: str = "learned"
    bias: bool = False
    scale: float | None = None
    causal: bool = False
    attention_kernel: str = "manual"
    attention: str = DEFAULT_KIND
    window: int = 64
    projection_length: int = 128
    global_tokens: int = 1
    ngrams: int = 0
    ngram_buckets: int = 2**20
    ngram_fitted: bool = False
    ngram_weighting: str = "tfidf"
    layer_heads: list[int] | None = None
    attention_args: dict | None = None
    attention_source: dict | None = None

    def __post_init__(self):
        for name in ("vocab_size", "max_length", "d_model", "n_heads", "n_layers"):
            check_whole_number(name, getattr(self, name), 1)
        check_whole_number("num_classes", self.num_classes, 2)
        check_whole_number("d_ff", self.d_ff, 0)
        check_whole_number("ngrams", self.ngrams, 0)
        check_whole_number("ngram_buckets", self.ngram_buckets, 1)
        if self.ngram_buckets > 2**31:  # the hash stays inside int64 (model/ngrams.py)
            raise ConfigError(f"ngram_buckets must be at most 2^31, got {self.ngram_buckets}")
        if self.ngram_fitted and not self.ngrams:
            raise ConfigError("ngram_fitted needs an n-gram bag: set ngrams (2 = words and word pairs)")
        if self.ngram_weighting not in NGRAM_WEIGHTINGS:
            raise ConfigError(f"ngram_weighting must be one of {', '.join(NGRAM_WEIGHTINGS)}, "
                              f"got {self.ngram_weighting!r}")
        if self.ngram_weighting == "nb" and self.num_classes != 2:
            raise ConfigError(f"ngram_weighting nb weighs n-grams by how much likelier they are in one of two classes: "
                              f"it needs num_classes 2, got {self.num_classes} (use tfidf)")
        if self.d_head is not None:
            check_whole_number("d_head", self.d_head, 1)
        elif self.n_heads > self.d_model:
            raise ConfigError(
                f"n_heads {self.n_heads} is larger than d_model {self.d_model}: each head would have size 0 "
                "(lower n_heads or set d_head)"
            )
        for name in ("dropout", "embedding_dropout", "attention_dropout", "head_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {value}")
        _one_of("pooling", self.pooling, POOLINGS)
        _one_of("positions", self.positions, POSITIONS)
        _one_of("attention_kernel", self.attention_kernel, KERNELS)
        kind = find_kind(self.attention)
        if kind is None:
            _one_of("attention", self.attention, (*ATTENTION_KINDS, AUTO))
        # What the config records of the kind's code: a user's class found, hashed and trusted (or a checkpoint's
        # record checked); "auto" stands for kinds of the product, which record none
        object.__setattr__(self, "attention_source", (kind or Kind).source(self))
        for kind in ATTENTION_KINDS.values():  # every kind's settings, whichever kind is chosen: no typo waits
            for name, low in kind.least.items():
                check_whole_number(name, getattr(self, name), low)
        if self.attention != AUTO:
            attention_kind(self.attention).check(self)  # the kind's own rules (window, projection, causal, ...)
        if self.max_length > MAX_LENGTH:
            raise ConfigError(f"max_length {self.max_length} is larger than {MAX_LENGTH} tokens")
        parameters = self.parameter_count()
        if parameters > MAX_PARAMETERS:
            raise ConfigError(f"the network would have {parameters:,} weights (vocab_size {self.vocab_size}, "
                              f"d_model {self.d_model}, n_heads {self.n_heads}, n_layers {self.n_layers}, d_ff "
                              f"{self.d_ff}), more than {MAX_PARAMETERS:,}: lower them")
        if self.layer_heads is not None:
            object.__setattr__(self, "layer_heads", list(self.layer_heads))  # a list: plain data in the checkpoint
            if len(self.layer_heads) != self.n_layers:
                raise ConfigError(f"layer_heads has {len(self.layer_heads)} counts for n_layers {self.n_layers}")
            for count in self.layer_heads:
                if not isinstance(count, int) or isinstance(count, bool) or not 1 <= count <= self.n_heads:
                    raise ConfigError(f"layer_heads must hold integers in 1..n_heads {self.n_heads}, "
                                      f"got {self.layer_heads}")
        if not (isinstance(self.embedding_std, (int, float)) and 0 < self.embedding_std <= 10):
            raise ConfigError(f"embedding_std must be in (0, 10], got {self.embedding_std!r}")
        if self.scale is not None and not self.scale > 0:
            raise ConfigError(f"scale must be > 0 (or null for 1/sqrt(d_head)), got {self.scale}")
        if self.attention == AUTO:
            self.resolved()  # the kind it stands for must be valid too (a window longer than the text, ...)
        if self.causal and self.pooling == "first":
            # With the look-ahead mask the first token sees only itself: the sentence vector would ignore the text.
            raise ConfigError("causal: true with pooling: first would classify the first token alone; "
                              "use pooling mean, max or attention")

    @property
    def head_size(self) -> int:
        return self.d_head or self.d_model // self.n_heads

    def parameter_count(self) -> int:
        """About how many weights the network has (biases and LayerNorms left out), for the upper bound."""
        inner = self.n_heads * self.head_size
        layer = 4 * self.d_model * inner + 2 * self.d_model * self.d_ff
        extra = 0 if self.attention == AUTO else attention_kind(self.attention).extra_parameters(self)
        embeddings = (self.vocab_size + self.max_length + self.num_classes) * self.d_model  # tokens, positions, head
        ngrams = (self.vocab_size + self.ngram_buckets) * self.num_classes if self.ngrams else 0
        return embeddings + ngrams + self.n_layers * (layer + extra)

    def resolved(self) -> "NetworkConfig":
        """This config with attention "auto" made concrete: full up to FULL_ATTENTION_MAX_LENGTH tokens, local
        (`window` tokens on each side) beyond. Networks and checkpoints only ever hold a concrete kind."""
        if self.attention != AUTO:
            return self
        return replace(self, attention=AUTO_KINDS[self.max_length > FULL_ATTENTION_MAX_LENGTH])

    def heads_in_layer(self, layer: int) -> int:
        """How many heads layer `layer` has: n_heads, or its count in layer_heads after pruning."""
        return self.n_heads if self.layer_heads is None else self.layer_heads[layer]

    def to_dict(self) -> dict:
        """Plain data for the checkpoint (loadable with torch.load(weights_only=True))."""
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict) -> "NetworkConfig":
        """Rebuild from a checkpoint's dict; an unknown key is an error (a setting renamed since must not vanish).
        A user's class must come with its recorded source: a checkpoint's spec alone is never resolved (imported)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"unknown network setting(s) {', '.join(unknown)}")
        kind = find_kind(values.get("attention"))
        if kind is not None and kind.names_code and values.get("attention_source") is None:
            raise ConfigError(f"attention {values['attention']!r:.200} without the attention_source the product "
                              "records: a user's class is loaded only when the user names it, never from a "
                              "checkpoint's string")
        return cls(**values)


def _one_of(name: str, value, choices) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def network_config(hparams: dict, label_names: list[str]) -> NetworkConfig:
    """The NetworkConfig a checkpoint stores under hyper_parameters["network"]."""
    config = NetworkConfig.from_dict(hparams["network"])
    if config.num_classes != len(label_names):
        raise ValueError(f"num_classes {config.num_classes} but {len(label_names)} label names")
    return config


def max_length_caps(attention: str) -> list[int]:
    """How long a data.max_length left unset may be for this attention kind (train.py hands it to the data as
    data.max_length_caps): the kind's `length_cap` (full attention costs L², so [256]; the cheaper kinds read whole
    texts, [2048]); "auto" both of its kinds' caps, [256, 2048]: the data takes 2,048 when many training texts are
    longer than 256 tokens, and `resolved` then reads them with local attention. (An unknown kind gets [256];
    NetworkConfig refuses it.)"""
    if attention == AUTO:
        return [ATTENTION_KINDS[kind].length_cap for kind in AUTO_KINDS]
    return [ATTENTION_KINDS.get(attention, ATTENTION_KINDS[AUTO_KINDS[0]]).length_cap]
