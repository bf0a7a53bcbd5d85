"""The Lightning "system" around AttentionClassifier: loss, metrics, optimizer and schedule. Its typed
__init__ arguments are the `model:` section of a config."""

import copy
import math

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

from model.classifier import AttentionClassifier

UNK_ID = 1  # data/tokenizer.py: [PAD] is 0, [UNK] is 1


class ClassifierModule(L.LightningModule):
    def __init__(
        self,
        vocab_size: int = 8000,
        label_names: list[str] | None = None,
        max_length: int = 128,
        d_model: int = 128,
        n_heads: int = 4,
        d_head: int | None = None,
        n_layers: int = 1,
        d_ff: int = 0,
        dropout: float = 0.1,
        embedding_dropout: float = 0.1,
        attention_dropout: float = 0.0,
        head_dropout: float = 0.0,
        pooling: str = "mean",
        positions: str = "learned",
        bias: bool = False,
        scale: float | None = None,
        causal: bool = False,
        lr: float = 1e-3,
        weight_decay: float = 0.01,
        warmup_fraction: float = 0.05,
        label_smoothing: float = 0.0,
        token_dropout: float = 0.0,
        ema_decay: float = 0.0,
    ):
        """
        Args:
            vocab_size: embedding rows; train.py sets it from the trained tokenizer.
            label_names: class names, index = class id; train.py sets them from the data.
            max_length: longest input in tokens (learned positions); train.py links it to data.max_length.
            d_model: width of embeddings and of every layer.
            n_heads: attention heads per layer.
            d_head: size of each head (default d_model // n_heads).
            n_layers: attention blocks stacked.
            d_ff: hidden width of the position-wise feed-forward after attention; 0 leaves it out.
            dropout: after attention and feed-forward, before each residual add.
            embedding_dropout: on token + position embeddings.
            attention_dropout: on the attention weights.
            head_dropout: on the pooled sentence vector, before the linear head.
            pooling: how token vectors become one sentence vector: mean, max, first or attention.
            positions: position vectors added to the token embeddings: learned, sinusoidal or none.
            bias: biases in W_Q, W_K, W_V, W_O (the textbook formula has none).
            scale: multiplies Q·Kᵀ; default 1/sqrt(d_head). Try 1.0 or 0.01 to see attention break.
            causal: add the look-ahead mask (each token sees only itself and earlier tokens).
            lr: peak learning rate of AdamW.
            weight_decay: AdamW weight decay (not applied to biases, LayerNorm and embeddings).
            warmup_fraction: share of training steps spent warming the learning rate up linearly; then it decays
                to zero on a cosine.
            label_smoothing: cross-entropy label smoothing.
            token_dropout: in training, the share of real tokens replaced by [UNK], so the model does not lean on
                single rare words and copes with words it never saw.
            ema_decay: above 0, `model` (validated, monitored, saved for prediction) is an exponential moving
                average of the weights the optimizer moves (`online_model`), updated after every step; it smooths
                out the noise of the last steps. 0 = no average: `model` is trained directly.
        """
        super().__init__()
        self.save_hyperparameters()
        self.label_names = list(label_names or ["0", "1"])
        num_classes = len(self.label_names)
        self.model = AttentionClassifier(
            vocab_size=vocab_size, num_classes=num_classes, d_model=d_model, n_heads=n_heads, d_head=d_head,
            n_layers=n_layers, d_ff=d_ff, max_length=max_length, dropout=dropout, embedding_dropout=embedding_dropout,
            attention_dropout=attention_dropout, head_dropout=head_dropout, pooling=pooling, positions=positions,
            bias=bias, scale=scale, causal=causal,
        )
        self._online = None
        if ema_decay > 0:
            self._online = copy.deepcopy(self.model)
            self.model.requires_grad_(False)  # the average is never trained directly (and DDP must not wait for it)
        metrics = MetricCollection(
            {"acc": MulticlassAccuracy(num_classes, average="micro"), "f1": MulticlassF1Score(num_classes, average="macro")}
        )
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics, self.val_loss = metrics.clone(prefix="val/"), MeanMetric()
        self.test_metrics, self.test_loss = metrics.clone(prefix="test/"), MeanMetric()

    @property
    def online_model(self) -> AttentionClassifier:
        """The network the optimizer trains: `model` itself, or with ema_decay the source of its average."""
        return self.model if self._online is None else self._online

    def forward(self, input_ids, padding_mask=None, need_weights=False):
        return self.model(input_ids, padding_mask, need_weights=need_weights)

    @torch.no_grad()
    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self._online is None:
            return
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
        self.log("train/loss", loss, prog_bar=True, batch_size=len(logits))
        self.train_metrics.update(logits, batch["labels"])
        self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        self.evaluate(batch, "val")

    def test_step(self, batch, batch_idx):
        self.evaluate(batch, "test")

    def evaluate(self, batch, stage):
        logits = self(batch["input_ids"], batch["padding_mask"]).logits
        loss = F.cross_entropy(logits, batch["labels"], reduction="none")
        mean_loss, metrics = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_metrics")
        mean_loss.update(loss)  # exact mean over the whole set, not a mean of batch means
        metrics.update(logits, batch["labels"])
        self.log(f"{stage}/loss", mean_loss, prog_bar=stage == "val")
        self.log_dict(metrics, prog_bar=stage == "val")

    def predict_step(self, batch, batch_idx):
        probabilities = self(batch["input_ids"], batch["padding_mask"]).logits.softmax(-1)
        return {"probabilities": probabilities, "labels": probabilities.argmax(-1)}

    def configure_optimizers(self):
        # Weight decay on matrices only: decaying embeddings, biases and LayerNorm gains only hurts.
        parameters = list(self.online_model.named_parameters())
        decay = [p for name, p in parameters if p.ndim >= 2 and "embedding" not in name]
        no_decay = [p for name, p in parameters if not (p.ndim >= 2 and "embedding" not in name)]
        optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": self.hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=self.hparams.lr,
        )
        total = max(1, self.trainer.estimated_stepping_batches)
        warmup = max(1, int(self.hparams.warmup_fraction * total))

        def schedule(step):
            if step < warmup:
                return (step + 1) / warmup
            return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
