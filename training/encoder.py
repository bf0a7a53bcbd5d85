"""The hand-over of a pretrained encoder to a classifier (`train.py fit --model.init_from <pretraining checkpoint>`):
which settings must match, and copying the encoder's weights."""

from dataclasses import fields
from pathlib import Path

import torch

from data.checkpoint import CheckpointError, network_weights, read_pretraining_checkpoint
from model.config import NetworkConfig

# The settings a fine-tuned classifier may choose apart from its pretraining run: dropout rates, the starting spread
# of embeddings it does not start from, pooling, the class head (the n-gram bag beside it too) and the kernel. Every other setting decides the
# encoder's weights or what they mean (a new field is one unless listed here).
FREE_SETTINGS = ("num_classes", "dropout", "embedding_dropout", "attention_dropout", "head_dropout", "embedding_std",
                 "pooling", "attention_kernel", "ngrams", "ngram_buckets", "ngram_fitted")
ENCODER_SETTINGS = tuple(f.name for f in fields(NetworkConfig) if f.name not in FREE_SETTINGS)
ENCODER_PARTS = ("token_embedding.", "position_embedding.", "embedding_norm.", "blocks.")  # names the classifier shares


def check_pretrained(path: str, network: NetworkConfig) -> dict:
    """The pretraining checkpoint at `path`, if a classifier with `network` can start from it; else CheckpointError
    naming what differs."""
    checkpoint = read_pretraining_checkpoint(path)
    try:
        trained = NetworkConfig.from_dict(checkpoint["hyper_parameters"]["network"])
    except (ValueError, TypeError) as e:
        raise CheckpointError(f"{path}: {e}") from e
    differences = [f"{name} {getattr(trained, name)!r} (this config: {getattr(network, name)!r})"
                   for name in ENCODER_SETTINGS if getattr(trained, name) != getattr(network, name)]
    if differences:
        raise CheckpointError(f"{path}: pretrained with {', '.join(differences)}; give the fine-tuning run the same "
                              "model.network settings as the pretraining run (its run's config.yaml)")
    return checkpoint


def encoder_state(checkpoint: dict) -> dict[str, torch.Tensor]:
    """The pretrained encoder's weights, named as in AttentionClassifier (token_embedding, position_embedding,
    blocks); the objective's head stays behind."""
    return {name: tensor for name, tensor in network_weights(checkpoint).items() if name.startswith(ENCODER_PARTS)}


def load_encoder(model: torch.nn.Module, path: str) -> int:
    """Copy the encoder weights of the pretraining checkpoint at `path` into `model` (an AttentionClassifier, or
    the module's EMA twin); returns how many tensors were copied. Every encoder parameter must be there."""
    checkpoint = check_pretrained(path, model.config)
    state = encoder_state(checkpoint)
    expected = {name for name in model.state_dict() if name.startswith(ENCODER_PARTS)}
    missing = sorted(expected - set(state))
    if missing or not state:
        raise CheckpointError(f"{Path(path)}: the pretrained encoder lacks {', '.join(missing[:3]) or 'every weight'}")
    with torch.no_grad():
        own = model.state_dict()
        for name in expected:
            if own[name].shape != state[name].shape:
                raise CheckpointError(f"{path}: {name} has shape {tuple(state[name].shape)}, this network "
                                      f"{tuple(own[name].shape)}")
            own[name].copy_(state[name])
    return len(expected)
