"""The Lightning system of `train.py pretrain` (model/pretraining.py's objectives on unlabeled text); the hand-over of
its encoder to a classifier is training/encoder.py."""

import lightning as L
import torch
from torchmetrics import MeanMetric

from data.tokenizer import FIRST_WORD_ID, MASK_ID
from model.config import ConfigError, NetworkConfig
from model.pretraining import OBJECTIVES, PretrainingNetwork, corrupt
from training.adapt import AdaptThreads
from training.module import NonFiniteLossError
from training.optimizer import adamw_with_warmup, optimizer_settings


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
                       self.network.vocab_size, generator, mask_id=MASK_ID, first_word_id=FIRST_WORD_ID)

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

    def configure_callbacks(self):
        return [AdaptThreads()]

    def configure_optimizers(self):
        return adamw_with_warmup(self, self.model)

    def configured_optimizer(self):
        """As ClassifierModule.configured_optimizer, for the network pretraining trains."""
        return self.model, optimizer_settings(self.hparams_initial, self.model)
