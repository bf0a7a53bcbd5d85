"""The Lightning "system" around AttentionClassifier: loss, metrics, optimizer and schedule. Its typed
__init__ arguments are the `model:` section of a config; the network itself is `model: network:` (NetworkConfig)."""

import copy
import logging
import math

import lightning as L
import torch
import torch.nn.functional as F
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MultilabelF1Score

from data.checkpoint import stored_calibration
from data.checkpoint import calibrated
from data.labels import balanced_weights, class_counts, describe_counts, is_imbalanced
from data.tokenizer import UNK_ID
from model.classifier import AttentionClassifier
from model.config import ConfigError, NetworkConfig
from training import calibration as calib
from training.encoder import load_encoder
from training.schedule import WarmupThenCosine

log = logging.getLogger(__name__)


# Why `auto` leaves imbalanced classes unweighted, said where a run starts (measured: docs/RESULTS.md).
IMBALANCED_UNWEIGHTED = ("each text weighs the same: on held-out texts as imbalanced as these, balanced weights cost "
                         "accuracy and macro-F1; --model.class_weights balanced where the classes met in use are "
                         "more even")


def check_class_weights(weights, label_names: list[str]) -> None:
    """ConfigError (one line) unless `weights` is one finite number > 0 per class: a weight of 0 or below would
    unlearn or ignore its class, and NaN or inf would make the loss NaN at the first step (blamed on nothing)."""
    if len(weights) != len(label_names):
        raise ConfigError(f"model.class_weights has {len(weights)} numbers for {len(label_names)} classes "
                          f"({', '.join(label_names)}): give one a class, in that order")
    for name, weight in zip(label_names, weights):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
            raise ConfigError(f"model.class_weights: the weight of class {name!r} is {weight!r}: need a finite "
                              "number > 0 (1 is unweighted)")


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
        multi_label: bool = False,
        class_weights: str | list[float] | None = "auto",
        calibration: bool = True,
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
            multi_label: several labels a text: a sigmoid per label and binary cross-entropy, a text's answer the
                labels whose probability reaches their threshold; train.py sets it from the data (docs/LABELS.md).
            class_weights: weights of the classes in the training loss: "balanced" (each class weighs the same:
                scikit-learn's rule; several labels a text: each label's positives as much as its negatives), a
                list (one finite number > 0 per class, in label order), null (none), or "auto": none, imbalanced
                classes too (on held-out texts as imbalanced as the training texts, balanced weights cost accuracy
                and macro-F1: docs/RESULTS.md "Imbalanced classes"); balanced suits classes met in use more even
                than the training texts.
            calibration: after each validation pass of a fit, fit on validation a temperature (one label a text)
                or per-label thresholds (several), stored in the checkpoint and applied by predict, serve and the
                ONNX export. false: temperature 1, thresholds 0.5.
        """
        super().__init__()
        if class_weights not in (None, "auto", "balanced") and not isinstance(class_weights, (list, tuple)):
            raise ConfigError(f"model.class_weights must be auto, balanced, null or a list of numbers, got {class_weights!r}")
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
        if isinstance(class_weights, (list, tuple)):
            check_class_weights(class_weights, self.label_names)
        if multi_label:  # validation and test figures use the fitted thresholds: computed per split (_score_split)
            metrics = MetricCollection({"f1": MultilabelF1Score(num_classes, average="macro")})
        else:
            metrics = MetricCollection({"acc": MulticlassAccuracy(num_classes, average="micro"),
                                        "f1": MulticlassF1Score(num_classes, average="macro")})
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics, self.val_loss = metrics.clone(prefix="val/"), MeanMetric()
        self.test_metrics, self.test_loss = metrics.clone(prefix="test/"), MeanMetric()
        # Set by the attention monitor: validation_step then asks the network for its attention (the very
        # weights and scores of this forward pass) and returns them for the monitor to read.
        self.keep_validation_attention = False
        # Fitted on validation (calibration) and stored in the checkpoint under "calibration".
        self.temperature, self.thresholds = 1.0, None
        self.register_buffer("loss_weights", None, persistent=False)  # from the training labels at fit start
        self._outputs = {"val": [], "test": []}  # (logits, labels) of the split's batches, scored at its end

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
                f"the learning rate ({self.hparams.lr}) is likely too high; try lowering --model.lr. "
                "Checkpoints already saved are kept"
            )
        self.log("train/loss", loss, prog_bar=True, batch_size=len(logits))
        self.train_metrics.update(logits, batch["labels"].long() if self.hparams.multi_label else batch["labels"])
        self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        return self.evaluate(batch, "val", need_weights=self.keep_validation_attention)

    def test_step(self, batch, batch_idx):
        self.evaluate(batch, "test")

    def evaluate(self, batch, stage, need_weights=False):
        logits, attention = self(batch["input_ids"], batch["padding_mask"], need_weights=need_weights)
        loss = self.loss(logits, batch["labels"])
        mean_loss, metrics = getattr(self, f"{stage}_loss"), getattr(self, f"{stage}_metrics")
        mean_loss.update(loss)  # exact mean over the whole set, not a mean of batch means
        self.log(f"{stage}/loss", mean_loss, prog_bar=stage == "val")
        if not self.hparams.multi_label:
            metrics.update(logits, batch["labels"])
            self.log_dict(metrics, prog_bar=stage == "val")
        self._outputs[stage].append((logits.detach().float().cpu(), batch["labels"].cpu()))
        return {"logits": logits, "attention": attention}

    def loss(self, logits, targets, **settings):
        """Per text: cross-entropy (one label a text; targets class ids or probabilities; settings: its weight and
        label_smoothing), or binary cross-entropy averaged over the labels (several; the weight is then each
        label's positive weight, and label smoothing does not apply)."""
        if self.hparams.multi_label:
            return F.binary_cross_entropy_with_logits(logits, targets.float(), pos_weight=settings.get("weight"),
                                                      reduction="none").mean(-1)
        return F.cross_entropy(logits, targets, reduction="none", **settings)

    def probabilities(self, logits):
        """Calibrated probabilities: sigmoid per label, or softmax of the logits divided by the temperature."""
        return calibrated(logits, self.hparams.multi_label, self.temperature)

    def predict_step(self, batch, batch_idx):
        probabilities = self.probabilities(self(batch["input_ids"], batch["padding_mask"]).logits)
        if self.hparams.multi_label:
            return {"probabilities": probabilities, "labels": calib.label_sets(probabilities, self.label_thresholds)}
        return {"probabilities": probabilities, "labels": probabilities.argmax(-1)}

    @property
    def label_thresholds(self) -> list[float]:
        return self.thresholds or [0.5] * len(self.label_names)

    def on_validation_epoch_start(self):
        self._outputs["val"] = []

    def on_test_epoch_start(self):
        self._outputs["test"] = []

    def on_validation_epoch_end(self):
        if self.trainer.sanity_checking:
            self._outputs["val"] = []
            return
        self._score_split("val", fit=self.trainer.state.fn == "fit" and self.hparams.calibration)

    def on_test_epoch_end(self):
        self._score_split("test", fit=False)

    def _score_split(self, stage: str, fit: bool) -> None:
        """The split's figures from all its outputs: with `fit`, the temperature or thresholds are fitted first on
        these (validation) outputs; macro-F1 (and with several labels a text micro-F1, subset accuracy as acc),
        ECE; TensorBoard gets per-class figures, the confusion matrix and the reliability diagram; outside a fit
        (validate, test) the per-class table is logged too."""
        outputs, self._outputs[stage] = self._outputs[stage], []
        if not outputs:
            return
        logits = torch.cat([o[0] for o in outputs])
        labels = torch.cat([o[1] for o in outputs])
        multi = self.hparams.multi_label
        if fit and multi:
            self.thresholds = calib.fit_thresholds(logits.sigmoid(), labels)
        elif fit:
            self.temperature = calib.fit_temperature(logits, labels)
        probabilities = self.probabilities(logits)
        figures = calib.scores(probabilities, labels, multi, self.label_thresholds if multi else None)
        per_class = figures.pop("per_class")
        if multi:  # single-label acc and f1 are the torchmetrics objects logged per step
            self.log_dict({f"{stage}/{name}": value for name, value in figures.items()}, prog_bar=stage == "val")
        self.log(f"{stage}/ece", calib.expected_calibration_error(probabilities, labels, multi))
        if not multi:
            self.log(f"{stage}/temperature", self.temperature)
            raw = logits.softmax(-1)
            self.log(f"{stage}/ece_uncalibrated", calib.expected_calibration_error(raw, labels, multi))
        for name, row in zip(self.label_names, per_class.tolist()):
            self.log(f"{stage}_per_class/f1_{name}", row[2])
        if self.trainer.state.fn != "fit":
            log.info("%s per class (%s):\n%s", stage, "thresholds fitted on validation" if multi and self.thresholds
                     else "temperature %.3f" % self.temperature, calib.per_class_table(per_class, self.label_names))
        self._log_figures(stage, probabilities, labels)

    def _log_figures(self, stage, probabilities, labels) -> None:
        experiment = getattr(self.logger, "experiment", None)
        if not hasattr(experiment, "add_figure"):  # TensorBoard only
            return
        import matplotlib.pyplot as plt

        multi, step = self.hparams.multi_label, self.global_step
        matrix = calib.confusion(probabilities, labels, multi, self.label_thresholds if multi else None)
        for name, figure in (("confusion_matrix", calib.confusion_figure(matrix, self.label_names,
                                                                           f"{stage} confusion, step {step}")),
                             ("reliability", calib.reliability_figure(probabilities, labels, multi,
                                                                      f"{stage} reliability, step {step}"))):
            experiment.add_figure(f"{stage}/{name}", figure, global_step=step)
            plt.close(figure)

    def on_save_checkpoint(self, checkpoint):
        # Plain numbers and lists: the checkpoint still loads with torch.load(weights_only=True).
        checkpoint["calibration"] = {"temperature": float(self.temperature), "thresholds": list(self.thresholds or [])}
        data = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if hasattr(data, "files_read"):  # the data files as read: diagnose.py notes one changed since training
            checkpoint["data_files"] = data.files_read()

    def on_load_checkpoint(self, checkpoint):
        self.temperature, self.thresholds = stored_calibration(checkpoint)  # checked (data/checkpoint.py)

    def setup(self, stage):
        # Before Lightning restores a --ckpt_path (which then overwrites these weights when resuming).
        if stage == "fit" and self.hparams.init_from:
            for network in {id(m): m for m in (self.model, self.online_model)}.values():
                load_encoder(network, self.hparams.init_from)

    def on_fit_start(self):
        self.choose_loss_weights()
        # After Lightning restored the weights of a --ckpt_path (trainer.ckpt_path is set by then): a resumed run
        # keeps them.
        if self.hparams.word_vectors and self.trainer.ckpt_path is None:
            self.start_from_word_vectors(self.trainer.datamodule.split("train"))

    def choose_loss_weights(self) -> None:
        """Class weights of the training loss from model.class_weights and the training labels (logged)."""
        setting, multi = self.hparams.class_weights, self.hparams.multi_label
        data = getattr(self.trainer, "datamodule", None)
        if setting is None or not hasattr(data, "split"):
            return
        if isinstance(setting, (list, tuple)):
            self.loss_weights = torch.tensor(setting, dtype=torch.float32, device=self.device)
            log.info("class weights (model.class_weights): %s", list(setting))
            return
        labels = data.split("train").labels
        counts = class_counts(labels, len(self.label_names))
        sampled = getattr(data, "balanced_sampler", False)
        if sampled and setting == "balanced":  # each would even the classes out: together, a rare class counts twice
            raise ConfigError("model.class_weights balanced and data.balanced_sampler both balance the classes: "
                              "give one (model.class_weights auto leaves the loss unweighted under the sampler)")
        if setting == "auto" and sampled:
            log.info("class weights: none (model.class_weights auto: data.balanced_sampler draws the classes evenly; "
                     "%s)", describe_counts(counts, self.label_names))
            return
        if setting == "auto":
            log.info("class weights: none (model.class_weights auto: %s; %s)", "several labels a text, thresholds "
                     "fitted instead" if multi else IMBALANCED_UNWEIGHTED if is_imbalanced(counts, multi) else
                     "classes not imbalanced", describe_counts(counts, self.label_names))
            return
        self.loss_weights = balanced_weights(counts, len(labels), multi).to(self.device)
        log.info("class weights balanced (model.class_weights %s; %s): %s", setting,
                 describe_counts(counts, self.label_names),
                 ", ".join(f"{n} {w:.2f}" for n, w in zip(self.label_names, self.loss_weights.tolist())))

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

    def configured_optimizer(self) -> tuple[torch.nn.Module, dict[str, dict]]:
        """(the network the optimizer trains, {parameter name: {"lr", "weight_decay"}}) by the settings the run was
        configured with (hparams_initial: a change made to hparams after that is not configuration)."""
        return self.online_model, optimizer_settings(self.hparams_initial, self.online_model)


def adamw_with_warmup(module: L.LightningModule, network: torch.nn.Module) -> dict:
    """AdamW on `network` with module.hparams' lr and weight_decay, a linear warm-up over warmup_fraction of the
    steps, then a cosine decay to zero (training/schedule.py). Weight decay on matrices only: decaying embeddings,
    biases and LayerNorm gains only hurts."""
    hparams = module.hparams
    parameters = list(network.named_parameters())
    decay = [p for name, p in parameters if decays(name, p)]
    no_decay = [p for name, p in parameters if not decays(name, p)]
    groups = [{"params": decay, "weight_decay": hparams.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel makes one pass over each weight, its gradient and moments (the update is bound by memory:
    # 2M embedding weights at every step); the same AdamW update. CPU and CUDA have it (torch >= 2.4 on CPU).
    fused = all(p.device.type in ("cpu", "cuda") for _, p in parameters)
    try:
        optimizer = torch.optim.AdamW(groups, lr=hparams.lr, fused=fused or None)
    except RuntimeError:  # a torch without the fused kernel for these weights
        optimizer = torch.optim.AdamW(groups, lr=hparams.lr)
    scheduler = WarmupThenCosine(optimizer, module.trainer.estimated_stepping_batches, hparams.warmup_fraction)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def decays(name: str, parameter: torch.Tensor) -> bool:
    """Whether adamw_with_warmup applies weight decay to this parameter: matrices, not embeddings."""
    return parameter.ndim >= 2 and "embedding" not in name


def optimizer_settings(hparams, network: torch.nn.Module) -> dict[str, dict]:
    """{parameter name: {"lr", "weight_decay"}}: what adamw_with_warmup gives each parameter of `network` by these
    hparams, for the attention monitor to compare with the optimizer the run holds (monitor/contract.py)."""
    return {name: {"lr": hparams["lr"], "weight_decay": hparams["weight_decay"] if decays(name, p) else 0.0}
            for name, p in network.named_parameters()}
