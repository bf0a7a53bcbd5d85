"""The Lightning system of `train.py pretrain` (model/pretraining.py's objectives on unlabeled text), and the hand-over
of its encoder to a classifier (`train.py fit --model.init_from <pretraining checkpoint>`)."""

from pathlib import Path

import lightning as L
import torch
from torchmetrics import MeanMetric

from model.checkpoint import CheckpointError, read_pretraining_checkpoint
from model.config import ConfigError, NetworkConfig
from model.pretraining import OBJECTIVES, PretrainingNetwork, corrupt
from training.module import NonFiniteLossError, adamw_with_warmup

# The settings that decide the encoder's weights and what they mean: a classifier fine-tuned from a pretraining
# checkpoint must have the same. Dropout rates, pooling, the class head and the kernel may differ.
ENCODER_SETTINGS = ("vocab_size", "max_length", "d_model", "n_heads", "d_head", "n_layers", "d_ff", "positions",
                    "embedding_norm", "bias", "scale", "causal", "attention", "window", "projection_length",
                    "global_tokens", "layer_heads")
ENCODER_PARTS = ("token_embedding.", "position_embedding.", "embedding_norm.", "blocks.")  # names the classifier shares


class PretrainModule(L.LightningModule):
    def __init__(
        self,
        network: NetworkConfig = NetworkConfig(),
        objective: str = "masked",
        mask_fraction: float = 0.15,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_fraction: float = 0.05,
    ):
        """
        Args:
            network: the network's shape (model/config.py), the same `network:` section the fine-tuning config
                gives; vocab_size and max_length come from the pretraining text. Pooling and the class head are
                not part of pretraining.
            objective: "masked" (predict chosen tokens, head tied to the embedding) or "replaced" (say which tokens
                were swapped for others), model/pretraining.py.
            mask_fraction: share of the real tokens chosen per text (at least one per text).
            lr, weight_decay, warmup_fraction: AdamW and its schedule, as for the classifier.
        """
        super().__init__()
        if objective not in OBJECTIVES:
            raise ConfigError(f"model.objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
        if not 0.0 < mask_fraction < 1.0:
            raise ConfigError(f"model.mask_fraction must be between 0 and 1 (exclusive), got {mask_fraction}")
        if isinstance(network, dict):
            network = NetworkConfig.from_dict(network)
        network = network.resolved()  # attention "auto" → full or local by max_length, as for the classifier
        self.save_hyperparameters(ignore=["network"])
        self.hparams["network"] = network.to_dict()
        self.network = network
        self.model = PretrainingNetwork(network, objective)
        self.label_names = None  # no classes: the attention monitor draws its probes without a prediction
        self.train_acc, self.val_loss, self.val_acc = MeanMetric(), MeanMetric(), MeanMetric()
        self.keep_validation_attention = False  # set by the attention monitor, as for the classifier

    def corrupt(self, batch, generator=None):
        return corrupt(self.hparams.objective, batch["input_ids"], batch["padding_mask"], self.hparams.mask_fraction,
                       self.network.vocab_size, generator)

    def training_step(self, batch, batch_idx):
        loss, correct, _ = self.model.loss(self.corrupt(batch), batch["padding_mask"])
        if not torch.isfinite(loss):
            raise NonFiniteLossError(
                f"pretraining loss is {loss.item()} at step {self.trainer.global_step}: the learning rate "
                f"({self.hparams.lr}) is likely too high; try lowering --model.lr. Checkpoints already saved are kept")
        self.log("train/loss", loss, prog_bar=True, batch_size=len(correct))
        self.train_acc.update(correct)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        # The same places masked in every validation pass: epochs are compared on the same task.
        generator = torch.Generator(device=batch["input_ids"].device).manual_seed(batch_idx)
        loss, correct, output = self.model.loss(self.corrupt(batch, generator), batch["padding_mask"],
                                                need_weights=self.keep_validation_attention)
        self.val_loss.update(loss, weight=len(correct))
        self.val_acc.update(correct)
        self.log("val/loss", self.val_loss, prog_bar=True)
        self.log("val/acc", self.val_acc, prog_bar=True)
        return {"attention": output.attention}

    def configure_optimizers(self):
        return adamw_with_warmup(self, self.model)


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
    state = {name.removeprefix("model."): tensor for name, tensor in checkpoint["state_dict"].items()}
    return {name: tensor for name, tensor in state.items() if name.startswith(ENCODER_PARTS)}


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
