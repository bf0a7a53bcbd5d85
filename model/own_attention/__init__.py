"""A user's own attention class, unchanged, as an attention kind: `--model.network.attention path/to/file.py:Class`.

Its one home: the rest of the project imports what it needs of a user's class from here, and asks the class what it
asks every kind (model/kind.py's interface; model/kinds.py finds the kind for a setting).

    naming.py        the class by name: "path/to/file.py:ClassName", "package.module:ClassName" or
                     "package.module.ClassName" found, imported, hashed and trusted (name_class); a checkpoint's record
                     of it is data, never imported (named_network, configured_class)
    constructor.py   the class built from the network's sizes, its constructor read by parameter names
    mask_probe.py    how its forward takes a mask, what it returns, whether it is causal: found by running it
    weights_seen.py  its weights, seen while it runs (returned, an attribute, a softmax, a fused call)
    layer.py         OwnAttention, the adapter a Block holds: the kind's interface around the class
"""

from model.own_attention.constructor import SIZE_NAMES, build_user_layer, built_once, built_with, dropout_arguments
from model.own_attention.layer import ROLE_NAMES, OwnAttention, normal
from model.own_attention.mask_probe import NoConvention, inputs_taken, mask_calls, mask_free_run, runs
from model.own_attention.naming import ALLOW_CHANGED, load_attention_class, named_network

__all__ = ["ALLOW_CHANGED", "NoConvention", "OwnAttention", "ROLE_NAMES", "SIZE_NAMES", "build_user_layer",
           "built_once", "built_with", "dropout_arguments", "inputs_taken", "load_attention_class", "mask_calls",
           "mask_free_run", "named_network", "normal", "runs"]
