"""The Lightning "system" around AttentionClassifier: loss, metrics, optimizer and schedule. Its typed
__init__ arguments are the `model:` section of a config; the network itself is `model: network:` (NetworkConfig)."""

import copy
import logging
import math

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from data.tokenizer import UNK_ID
from model.classifier import AttentionClassifier
from model.config import ConfigError, NetworkConfig
from training.encoder import load_encoder

log = logging.getLogger(__name__)


class NonFiniteLossError(RuntimeError):
    """Training produced a NaN or infinite loss; training stops before any checkpoint holds broken weights."""


class ClassifierModule(L.LightningModule):
    def __init__(
        self,
        network: NetworkConfig = NetworkConfig(),
        label_names: list[str] | None = None,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_fraction: float = 0.05,
        label_smoothing: float = 0.0,
        token_dropout: float = 0.0,
        ema_decay: float = 0.0,
        distillation: float = 0.0,
        init_from: str | None = None,
        word_vectors: int = 0,
    ):
        """
        Args:
            network: the network's shape and behaviour (model/config.py); its sizes that the data decides
                (vocab_size, num_classes, max_length) are filled in by train.py.
            label_names: class names, index = class id; train.py sets them from the data.
            lr: peak learning rate of AdamW.
            weight_decay: AdamW weight decay (not applied to biases, LayerNorm and embeddings).
            warmup_fraction: share of training steps spent warming the learning rate up linearly; then it decays
                to zero on a cosine.
            label_smoothing: cross-entropy label smoothing.
            token_dropout: in training, the share of real tokens replaced by [UNK], so the model does not lean on
                single rare words and copes with words it never saw.
            ema_decay: above 0, `model` (validated, monitored, saved for prediction) is an exponential moving
                average of the weights the optimizer moves (`online_model`), updated after every optimizer step;
                it smooths out the noise of the last steps. 0 = no average: `model` is trained directly.
            distillation: weight α of the teacher in the training loss, (1 - α)·CE(labels) + α·CE(teacher's
                probabilities); needs data.teacher (data/teacher.py). 0 = labels only.
            init_from: a pretraining checkpoint (`train.py pretrain`): a fresh fit starts from its embedding and
                attention blocks (training/encoder.py), and the data use its tokenizer. Resuming, validating and
                testing read the weights from --ckpt_path instead.
            word_vectors: epochs of skip-gram word vectors (training/word_vectors.py) trained on the training texts
                before a fresh fit; they become the token embedding's start, scaled to the spread it starts with
                (network.embedding_std). 0 = off; not with init_from; a resumed run keeps the weights of its --ckpt_path.
                Off in every shipped config: on IMDB's generic default they changed nothing, on SST-2 they cost
                1.4 points (docs/RESULTS.md "Word vectors of the training texts").
        """
        super().__init__()
        if word_vectors < 0:
            raise ConfigError(f"model.word_vectors must be 0 (off) or a number of epochs, got {word_vectors}")
        if word_vectors and init_from:
            raise ConfigError("model.word_vectors and model.init_from both set the starting embedding: give one")
        if not 0.0 <= distillation <= 1.0:
            raise ConfigError(f"model.distillation must be between 0 and 1, got {distillation}")
        if isinstance(network, dict):  # load_from_checkpoint hands back the plain dict the checkpoint stores
            network = NetworkConfig.from_dict(network)
        network = network.resolved()  # attention "auto" → full or local by max_length; the checkpoint holds that
        self.label_names = list(label_names or [str(c) for c in range(network.num_classes)])
        if len(self.label_names) != network.num_classes:
            raise ValueError(f"{len(self.label_names)} label names for num_classes {network.num_classes}")
        # Stored as plain data, so the checkpoint loads with torch.load(weights_only=True).
        self.save_hyperparameters(ignore=["network", "label_names"])
        self.hparams["network"] = network.to_dict()
        self.hparams["label_names"] = self.label_names
        self.network = network
        self.model = AttentionClassifier(network)
        self._online = None
        if ema_decay > 0:
            self._online = copy.deepcopy(self.model)
            self.model.requires_grad_(False)  # the average is never trained directly (and DDP must not wait for it)
        num_classes = network.num_classes
        metrics = MetricCollection(
            {"acc": MulticlassAccuracy(num_classes, average="micro"), "f1": MulticlassF1Score(num_classes, average="macro")}
        )
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics, self.val_loss = metrics.clone(prefix="val/"), MeanMetric()
        self.test_metrics, self.test_loss = metrics.clone(prefix="test/"), MeanMetric()
        # Set by the attention monitor: validation_step then asks the network for its attention (the very
        # weights and scores of this forward pass) and returns them for the monitor to read.
        self.keep_validation_attention = False

    @property
    def online_model(self) -> AttentionClassifier:
        """The network the optimizer trains: `model` itself, or with ema_decay the source of its average."""
        return self.model if self._online is None else self._online

    def forward(self, input_ids, padding_mask=None, need_weights=False):
        return self.model(input_ids, padding_mask, need_weights=need_weights)

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        if self._online is not None:
            self.update_average()

    @torch.no_grad()
    def update_average(self):
        # After each optimizer step, not each micro-batch: with gradient accumulation the decay stays per step.
        # The usual warm-up of the decay (as in TensorFlow's ExponentialMovingAverage): early on the average
        # follows the fast-moving weights closely instead of dragging the random initialisation along.
        step = self.trainer.global_step
        decay = min(self.hparams.ema_decay, (1 + step) / (10 + step))
        for averaged, online in zip(self.model.parameters(), self._online.parameters()):
            averaged.lerp_(online, 1.0 - decay)

    def training_step(self, batch, batch_idx):
        input_ids = batch["input_ids"]
        if self.hparams.token_dropout > 0:
            dropped = torch.rand(input_ids.shape, device=input_ids.device) < self.hparams.token_dropout
            input_ids = input_ids.masked_fill(dropped & ~batch["padding_mask"], UNK_ID)
        logits = self.online_model(input_ids, batch["padding_mask"]).logits
        loss = F.cross_entropy(logits, batch["labels"], label_smoothing=self.hparams.label_smoothing)
        if self.hparams.distillation > 0:
            if "teacher_probs" not in batch:
                raise ValueError("model.distillation needs a teacher's probabilities in the training batches: "
                                 "set data.teacher ngram")
            alpha = self.hparams.distillation
            loss = (1 - alpha) * loss + alpha * F.cross_entropy(logits, batch["teacher_probs"])
        if not torch.isfinite(loss):
            # Stop here: one more step would put NaN into the weights and the next checkpoint; those on disk stay.
            raise NonFiniteLossError(
                f"training loss is {loss.item()} at step {self.trainer.global_step} (epoch {self.current_epoch}): "
                f"the learning rate ({self.hparams.lr}) is likely too high; try lowering --model.lr. "
                "Checkpoints already saved are kept"
            )
        self.log("train/loss", loss, prog_bar=True, batch_size=len(logits))
        self.train_metrics.update(logits, batch["labels"])
        self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        return self.evaluate(batch, "val", need_weights=self.keep_validation_attention)

    def test_step(self, batch, batch_idx):
        self.evaluate(batch, "test")

    def evaluate(self, batch, stage, need_weights=False):
        logits, attention = self(batch["input_ids"], batch["padding_mask"], need_weights=need_weights)
        loss = F.cross_entropy(logits, batch["labels"], reduction="none")
        mean_loss, metrics = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_metrics")
        mean_loss.update(loss)  # exact mean over the whole set, not a mean of batch means
        metrics.update(logits, batch["labels"])
        self.log(f"{stage}/loss", mean_loss, prog_bar=stage == "val")
        self.log_dict(metrics, prog_bar=stage == "val")
        return {"logits": logits, "attention": attention}

    def predict_step(self, batch, batch_idx):
        probabilities = self(batch["input_ids"], batch["padding_mask"]).logits.softmax(-1)
        return {"probabilities": probabilities, "labels": probabilities.argmax(-1)}

    def setup(self, stage):
        # Before Lightning restores a --ckpt_path (which then overwrites these weights when resuming).
        if stage == "fit" and self.hparams.init_from:
            for network in {id(m): m for m in (self.model, self.online_model)}.values():
                load_encoder(network, self.hparams.init_from)

    def on_fit_start(self):
        # After Lightning restored the weights of a --ckpt_path (trainer.ckpt_path is set by then): a resumed run
        # keeps them.
        if self.hparams.word_vectors and self.trainer.ckpt_path is None:
            self.start_from_word_vectors(self.trainer.datamodule.split("train"))

    def start_from_word_vectors(self, split) -> None:
        """Skip-gram vectors of the training texts (split: an EncodedSplit) as the token embedding's start."""
        from training.word_vectors import starting_embedding

        epochs = self.hparams.word_vectors
        log.info("word vectors: %d skip-gram epochs on the %d training texts (%d tokens) before the first step",
                 epochs, len(split), len(split.ids))
        seed = int(torch.randint(2**31 - 1, ()))  # from the run's seed (seed_everything)
        table = starting_embedding(split, self.network, epochs=epochs, seed=seed)
        with torch.no_grad():
            for network in {id(m): m for m in (self.model, self.online_model)}.values():
                network.token_embedding.weight.copy_(table)

    def configure_optimizers(self):
        return adamw_with_warmup(self, self.online_model)


def adamw_with_warmup(module: L.LightningModule, network: torch.nn.Module) -> dict:
    """AdamW on `network` with module.hparams' lr and weight_decay, a linear warm-up over warmup_fraction of the
    steps, then a cosine decay to zero. Weight decay on matrices only: decaying embeddings, biases and LayerNorm
    gains only hurts."""
    hparams = module.hparams
    parameters = list(network.named_parameters())
    decay = [p for name, p in parameters if p.ndim >= 2 and "embedding" not in name]
    no_decay = [p for name, p in parameters if not (p.ndim >= 2 and "embedding" not in name)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=hparams.lr,
    )
    total = max(1, module.trainer.estimated_stepping_batches)
    warmup = max(1, int(hparams.warmup_fraction * total))

    def schedule(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
