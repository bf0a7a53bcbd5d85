"""Does an attention layer learn? The synthetic task of configs/smoke.yaml (which of two markers comes first: only
attention sees it) trained a few epochs with a given attention, against the built-in full layer trained alike.
`diagnose.py --attention FILE.py:Class --learn` reads it as the contract's last check.

    from monitor.learning import learns
    learns("my_attention.py:MyAttention")  # its accuracy, the same-shape built-in layer's, whether it learns
"""

import logging
import tempfile
import warnings
from pathlib import Path

import lightning as L
import yaml

from data.datamodule import TextDataModule
from model.config import NetworkConfig
from monitor.layer_formula import find_projections
from training.module import ClassifierModule

SMOKE = Path(__file__).resolve().parents[1] / "configs" / "smoke.yaml"
EPOCHS = yaml.safe_load(SMOKE.read_text())["trainer"]["max_epochs"]  # the smoke run's: about 0.96 with the
# built-in full layer; a class that learns alike but slower (the course's single head) needs them
MARGIN = 0.05  # a class learns when it reaches the built-in layer's accuracy less this (seeds differ by ~0.02)


def synthetic_accuracy(attention: str = "full", attention_args: dict | None = None, epochs: int = EPOCHS,
                       seed: int = 0, **network) -> tuple[float, dict]:
    """Validation accuracy of the classifier of configs/smoke.yaml with this attention (a kind's name or
    "file.py:Class") after `epochs` epochs, in this process, nothing written but a temporary cache; and the shape of
    its layer ({"n_heads", "d_head"} as its own projections show them; {} when not found). `network` overrides
    smoke.yaml's network settings."""
    config = yaml.safe_load(SMOKE.read_text())
    network = {**config["model"]["network"], **network}
    L.seed_everything(seed, verbose=False)
    with tempfile.TemporaryDirectory() as cache, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Lightning's advice on workers and logging, not about the layer
        for name in ("lightning.pytorch", "lightning.fabric"):
            logging.getLogger(name).setLevel(logging.ERROR)
        data = TextDataModule(**config["data"], cache_dir=cache, seed=seed)
        data.prepare_data()
        data.setup("fit")
        module = ClassifierModule(
            NetworkConfig(**network, vocab_size=data.vocab_size, num_classes=len(data.label_names),
                          max_length=data.max_length, attention=attention, attention_args=attention_args),
            label_names=data.label_names, lr=config["model"]["lr"])
        shape = shape_of(module.model.blocks[0].attention)
        trainer = L.Trainer(max_epochs=epochs, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0)
        trainer.fit(module, data)
        return float(trainer.callback_metrics["val/acc"]), shape


def shape_of(layer) -> dict:
    """{"n_heads", "d_head"} of a kind without a definition (a user's class) as its own projections show them (the
    course's class: 1 head of d_k, whatever the network's n_heads); {} for a kind with one (its settings say) or
    projections not found by name."""
    defined = layer.reference_keys_values is not None  # model/kind.py
    found = [] if defined else find_projections(layer.inner, layer.d_model, layer.n_heads)
    if not found:
        return {}
    heads = found[0].heads
    return {"n_heads": heads, "d_head": found[0].q[0].shape[0] // heads}


def learns(attention: str, attention_args: dict | None = None, epochs: int = EPOCHS) -> dict:
    """{"accuracy", "built_in", "shape", "learns"}: this attention's validation accuracy, and that of the built-in
    full layer of the same heads and head size (one head of 16 learns this task slower than two: the comparison is
    of the formula, not of the size), both after `epochs` epochs of the synthetic task from the same seed."""
    own, shape = synthetic_accuracy(attention, attention_args, epochs)
    built_in, _ = synthetic_accuracy("full", None, epochs, **shape)
    return {"accuracy": own, "built_in": built_in, "shape": shape, "learns": own >= built_in - MARGIN}
