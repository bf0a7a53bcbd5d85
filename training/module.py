"""The Lightning "system" around AttentionClassifier: loss, metrics and optimizer (training/optimizer.py). Its typed
__init__ arguments are the `model:` section of a config; the network itself is `model: network:` (NetworkConfig).
It attaches the start of a fit (training/starting.py) and the scoring of each split (training/scoring.py)."""

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MultilabelF1Score

from data.checkpoint import calibrated, stored_calibration
from data.tokenizer import UNK_ID
from model.classifier import AttentionClassifier
from model.config import ConfigError, NetworkConfig
from model.kinds import attention_kind
from training import calibration as calib
from training.adapt import AdaptThreads
from training.average import WeightAverage
from training.class_weights import check_class_weights
from training.optimizer import adamw_with_warmup, optimizer_settings
from training.scoring import SplitScores
from training.starting import StartOfFit, check_starting_weights


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
        ngram_start: float = 0.0,
        multi_label: bool = False,
        class_weights: str | list[float] | None = "auto",
        calibration: bool = True,
    ):
        """
        Args:
            network: the network's shape (model/config.py); train.py sets what the data decides (vocab_size,
                num_classes, max_length).
            label_names: class names, index = class id; train.py sets them from the data.
            lr: peak learning rate of AdamW.
            weight_decay: AdamW weight decay (not applied to biases, LayerNorm and embeddings).
            warmup_fraction: share of training steps warming the learning rate up linearly; then a cosine to zero.
            label_smoothing: cross-entropy label smoothing.
            token_dropout: in training, the share of real tokens replaced by [UNK]: no leaning on rare words.
            ema_decay: above 0, `model` (validated, monitored, saved) is an exponential moving average of the
                network trained (`online_model`), smoothing out its last steps (training/average.py). 0 = none.
            distillation: weight α of the teacher in the training loss, (1 - α)·CE(labels) + α·CE(teacher's
                probabilities); needs data.teacher (training/ngram_teacher.py). 0 = labels only.
            init_from: a pretraining checkpoint (`train.py pretrain`): a fresh fit starts from its embedding and
                attention blocks (training/encoder.py), the data use its tokenizer; a --ckpt_path's weights win.
            word_vectors: epochs of skip-gram word vectors (training/word_vectors.py) trained on the training texts
                before a fresh fit, as the token embedding's start (scaled to network.embedding_std). 0 = off; not with
                init_from. Off in every shipped config (docs/RESULTS.md "Word vectors of the training texts").
            ngram_start: with network.ngrams, the n-gram branch starts from this times the naive-Bayes log-count
                ratios of the training texts (training/ngram_start.py; NBSVM's weights) on a fresh fit. 0 = zeros.
                Not with network.ngram_fitted (a bag fitted as a regression, training/ngram_fit.py).
            multi_label: several labels a text: a sigmoid per label and binary cross-entropy, a text's answer the
                labels whose probability reaches their threshold; train.py sets it from the data (docs/LABELS.md).
            class_weights: weights of the classes in the training loss: "balanced" (each class weighs the same:
                scikit-learn's rule; several labels a text: each label's positives as much as its negatives), a list
                (one finite number > 0 per class, in label order), null (none), or "auto": none, imbalanced
                classes too (balanced weights cost accuracy and macro-F1 on texts as imbalanced as the training
                texts: docs/RESULTS.md "Imbalanced classes"; balanced suits classes met in use more even).
            calibration: at each validation of a fit, fit a temperature (one label a text) or per-label thresholds
                (several) for predict, serve and the ONNX export (training/scoring.py). false: 1 and 0.5.
        """
        super().__init__()
        check_starting_weights(word_vectors, init_from)
        if not 0.0 <= distillation <= 1.0:
            raise ConfigError(f"model.distillation must be between 0 and 1, got {distillation}")
        if isinstance(network, dict):  # load_from_checkpoint hands back the plain dict the checkpoint stores
            network = NetworkConfig.from_dict(network)
        network = network.resolved()  # attention "auto" → full or local by max_length; the checkpoint holds that
        if ngram_start and network.ngram_fitted:
            raise ConfigError("model.ngram_start starts learned n-gram votes, and network.ngram_fitted fits them "
                              "instead: give one")
        self.label_names = list(label_names or [str(c) for c in range(network.num_classes)])
        if len(self.label_names) != network.num_classes:
            raise ValueError(f"{len(self.label_names)} label names for num_classes {network.num_classes}")
        check_class_weights(class_weights, self.label_names)
        # Stored as plain data, so the checkpoint loads with torch.load(weights_only=True).
        self.save_hyperparameters(ignore=["network", "label_names"])
        self.hparams.update(network=network.to_dict(), label_names=self.label_names)
        self.network = network
        # `model` is validated, monitored and saved for prediction; with ema_decay it is the average (its
        # checkpoint keys model.*) of `_online`, the network the optimizer trains.
        self.model, self._online, self.average = AttentionClassifier(network), None, None
        check_long_texts(self.model, network)
        if ema_decay > 0:
            self.average = WeightAverage(self.model, ema_decay)
            self._online, self.model = self.model, self.average.network
        n = network.num_classes  # several labels a text: acc and f1 with the fitted thresholds come from SplitScores
        metrics = MetricCollection({"f1": MultilabelF1Score(n, average="macro")} if multi_label else {
            "acc": MulticlassAccuracy(n, average="micro"), "f1": MulticlassF1Score(n, average="macro")})
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics, self.val_loss = metrics.clone(prefix="val/"), MeanMetric()
        self.test_metrics, self.test_loss = metrics.clone(prefix="test/"), MeanMetric()
        # Set by the attention monitor: validation_step then returns the attention its forward pass computed.
        self.keep_validation_attention = False
        # Fitted on validation (training/scoring.py) and stored in the checkpoint under "calibration".
        self.temperature, self.thresholds = 1.0, None
        self.loss_weights = None  # from the training labels at fit start

    @property
    def online_model(self) -> AttentionClassifier:
        """The network the optimizer trains: `model` itself, or with ema_decay the source of its average."""
        return self.model if self._online is None else self._online

    def forward(self, input_ids, padding_mask=None, need_weights=False):
        return self.model(input_ids, padding_mask, need_weights=need_weights)

    def configure_callbacks(self):
        return [StartOfFit(), SplitScores(), AdaptThreads()]

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        if self.average is not None:  # after each optimizer step, not each micro-batch (gradient accumulation)
            self.average.update(self._online, self.trainer.global_step)

    def training_step(self, batch, batch_idx):
        input_ids = batch["input_ids"]
        if self.hparams.token_dropout > 0:
            dropped = torch.rand(input_ids.shape, device=input_ids.device) < self.hparams.token_dropout
            input_ids = input_ids.masked_fill(dropped & ~batch["padding_mask"], UNK_ID)
        # The fitted n-gram bag's part: each training text's out-of-fold logits (training/ngram_fit.py), so the
        # attention path learns what a bag that never saw the text gets wrong.
        logits = self.online_model(input_ids, batch["padding_mask"], ngram_logits=batch.get("ngram_logits")).logits
        loss = self.loss(logits, batch["labels"], weight=self.loss_weights,
                         label_smoothing=self.hparams.label_smoothing).mean()
        if self.hparams.distillation > 0:
            if "teacher_probs" not in batch:
                raise ValueError("model.distillation needs a teacher's probabilities in the training batches: "
                                 "set data.teacher ngram")
            alpha = self.hparams.distillation
            loss = (1 - alpha) * loss + alpha * self.loss(logits, batch["teacher_probs"]).mean()
        if not torch.isfinite(loss):
            # Stop here: one more step would put NaN into the weights and the next checkpoint; those on disk stay.
            raise NonFiniteLossError(
                f"training loss is {loss.item()} at step {self.trainer.global_step} (epoch {self.current_epoch}): "
                f"{non_finite_cause(self.network, self.hparams.lr, logits)}. Checkpoints already saved are kept")
        self.log("train/loss", loss, prog_bar=True, batch_size=len(logits))
        self.train_metrics.update(logits, batch["labels"].long() if self.hparams.multi_label else batch["labels"])
        return loss

    def on_train_epoch_end(self):
        # The epoch's metrics, logged once here rather than the metric objects at every step: Lightning moves a
        # logged metric object to its device at each self.log call, about 2 ms a step on a CPU (an SST-2 step is ~25).
        if next(iter(self.train_metrics.values())).update_called:
            self.log_dict(self.train_metrics.compute())
        self.train_metrics.reset()

    def validation_step(self, batch, batch_idx):
        return self.evaluate(batch, "val", need_weights=self.keep_validation_attention)

    def test_step(self, batch, batch_idx):
        return self.evaluate(batch, "test")

    def evaluate(self, batch, stage, need_weights=False):
        """One batch's loss and metrics; its logits (for SplitScores) and, when asked, attention (for the monitor)."""
        logits, attention = self(batch["input_ids"], batch["padding_mask"], need_weights=need_weights)
        loss = self.loss(logits, batch["labels"])
        mean_loss, metrics = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_metrics")
        mean_loss.update(loss)  # exact mean over the whole set, not a mean of batch means
        self.log(f"{stage}/loss", mean_loss, prog_bar=stage == "val")
        if not self.hparams.multi_label:
            metrics.update(logits, batch["labels"])
            self.log_dict(metrics, prog_bar=stage == "val")
        return {"logits": logits, "attention": attention}

    def loss(self, logits, targets, **settings):
        """Per text: cross-entropy (one label a text; targets class ids or probabilities; settings: weight,
        label_smoothing) or binary cross-entropy averaged over the labels (several; weight: each label's positives')."""
        if self.hparams.multi_label:
            return F.binary_cross_entropy_with_logits(logits, targets.float(), pos_weight=settings.get("weight"),
                                                      reduction="none").mean(-1)
        return F.cross_entropy(logits, targets, reduction="none", **settings)

    def probabilities(self, logits):
        """Calibrated probabilities: sigmoid per label, or softmax of the logits divided by the temperature."""
        return calibrated(logits, self.hparams.multi_label, self.temperature)

    @property
    def label_thresholds(self) -> list[float]:
        return self.thresholds or [0.5] * len(self.label_names)

    def predict_step(self, batch, batch_idx):
        probabilities = self.probabilities(self(batch["input_ids"], batch["padding_mask"]).logits)
        labels = calib.label_sets(probabilities, self.label_thresholds) if self.hparams.multi_label else None
        return {"probabilities": probabilities, "labels": probabilities.argmax(-1) if labels is None else labels}

    def on_save_checkpoint(self, checkpoint):  # the calibration is stored by SplitScores
        data = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if hasattr(data, "files_read"):  # the data files as read: diagnose.py notes one changed since training
            checkpoint["data_files"] = data.files_read()

    def on_load_checkpoint(self, checkpoint):
        self.temperature, self.thresholds = stored_calibration(checkpoint)  # checked (data/checkpoint.py)

    def configure_optimizers(self):
        return adamw_with_warmup(self, self.online_model)

    def configured_optimizer(self) -> tuple[torch.nn.Module, dict[str, dict]]:
        """(the network trained, {parameter name: {"lr", "weight_decay"}}) as configured (hparams_initial)."""
        return self.online_model, optimizer_settings(self.hparams_initial, self.online_model)


def check_long_texts(model: AttentionClassifier, network: NetworkConfig) -> None:
    """The attention must read a text of the run's max_length before training starts (a user's class is run on one:
    the doctor's probes read 7 tokens): one that raises or gives NaN past a length is one ConfigError line here, not
    a traceback mid-epoch."""
    problem = model.blocks[0].attention.problem_at_length(network.max_length)
    if problem:
        raise ConfigError(f"attention {network.attention}: {problem}: it cannot read this run's texts; fix the class "
                          f"(diagnose.py --attention {network.attention} --max-length {network.max_length} checks "
                          "it alone), or lower data.max_length")


def non_finite_cause(network: NetworkConfig, lr: float, logits: torch.Tensor) -> str:
    """The likely cause of a NaN or infinite loss: at the first steps with a user's class, what the class computed
    (the loss is NaN because the logits are); else a learning rate too high."""
    if attention_kind(network.attention).names_code and not torch.isfinite(logits).all():
        return (f"the network's outputs are NaN or infinite: the attention class {network.attention} computed them "
                f"on this batch (diagnose.py --attention {network.attention} --max-length {network.max_length} "
                "checks it alone), or the learning rate ({lr}) is too high (--model.lr)")
    return f"the learning rate ({lr}) is likely too high; try lowering --model.lr"
