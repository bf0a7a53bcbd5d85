"""AttentionMonitor: watch attention while a model trains, in TensorBoard, and say when something is wrong.

At the end of every validation epoch (never during the sanity check, whose model has not trained):
    attention/probe_<i>                         a layers × heads heatmap of fixed probe texts (image), each panel
                                                titled with its head's verdict (monitor/probes.py)
    attention_health/<figure>/layer<l>_head<h>  the per-head figures of monitor/health.py over the validation set
                                                (scalars), read from a fixed sample of up to `health_rows` rows per
                                                batch, and head_loss_delta (monitor/checks.py)
    attention_doctor/<figure>                   the model's figures: update_ratio, order_sensitivity, ... (scalars)
    attention_health/weights/layer<l>           a uniform sample of the attention weights (histogram)
    attention_health/verdicts                   the findings (monitor/doctor.py) and the figures, markdown (text)
and one `logging` warning per warning-finding (its figures, likely cause and what to try); notes at INFO. Each
pass's findings are appended to `history` ({"step", "epoch", "findings", "figures": the training figures not-learning
reads}), which the checkpoint keeps (state_dict, plain dicts) for diagnose.py.

The health figures come from the validation pass itself: while the monitor is attached, `validation_step` asks
the network to hand out the weights and scores its layers computed for that batch (no second forward pass, no
recomputation). The model checks (heads zeroed one at a time, tokens shuffled) run once per validation epoch on
its first `check_texts` texts. On training batches the monitor only reads the loss Lightning hands it and compares
the attention weights before and after each optimizer step (the update/weight ratio).
"""

import logging
import math

import torch
from lightning.pytorch import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from model.errors import check_whole_number
from model.kind import asks_look_ahead
from monitor.checks import SAMPLE_TEXTS, forward_passes
from monitor.contract import optimizer_differences
from monitor.doctor import SHOWN_FIGURES, Finding, figure_table_markdown, verdict_table_markdown
from monitor.dynamics import TrainingDynamics
from monitor.health import ROWS_PER_BATCH, AttentionHealth
from monitor.loss_contract import LossContract
from monitor.probes import ProbeHeatmaps
from monitor.units import Subject, examine

log = logging.getLogger(__name__)

LEARNING_FIGURES = ("train_loss", "prior_loss", "balanced_accuracy", "classes_seen")  # kept in the history
CHECK_SHARE, MIN_CHECK_TEXTS = 0.02, 16  # the model checks' share of the training work, and their fewest texts


class AttentionMonitor(Callback):
    def __init__(
        self,
        num_probes: int = 4,
        probe_texts: list[str] | None = None,
        every_n_train_steps: int = 0,
        max_tokens: int = 40,
        health_batches: int | None = None,
        health_rows: int | None = ROWS_PER_BATCH,
        check_texts: int = SAMPLE_TEXTS,
        warn: bool = True,
        warn_from_epoch: int = 0,
    ):
        """
        Args:
            num_probes: validation texts drawn as heatmaps, the same ones every epoch (evenly spaced through the
                validation split, of moderate length).
            probe_texts: extra texts to draw, tokenized with the data's tokenizer; they come after the
                validation probes.
            every_n_train_steps: also log the probe heatmaps every this many optimizer steps; 0 = only at the
                end of each validation epoch.
            max_tokens: heatmaps show at most this many tokens of a text.
            health_batches: validation batches the health figures are accumulated over; None = all of them.
            health_rows: query rows per validation batch the health figures read, a fixed random sample of the
                batch's counted rows (monitor/health.py); None = every row, which costs more than the validation
                pass itself on long texts.
            check_texts: validation texts (the first ones) the model checks run on once per validation epoch: each
                head zeroed in turn, the tokens shuffled (monitor/checks.py); 0 = no model checks. Fewer when they
                would cost more than 2% of the training since the last validation (at least 16).
            warn: log one warning per warning-finding (monitor/doctor.py), notes at INFO.
            warn_from_epoch: the first training epoch (from 0) whose validation may warn. A model that has taken
                no optimizer step at all never warns (its findings are still recorded and shown).
        """
        super().__init__()
        self.heatmaps = ProbeHeatmaps(num_probes, probe_texts, max_tokens)
        self.every_n_train_steps, self.health_batches = every_n_train_steps, health_batches
        check_whole_number("AttentionMonitor check_texts", check_texts, 0)
        check_whole_number("AttentionMonitor every_n_train_steps (0: at validation only)", every_n_train_steps, 0)
        check_whole_number("AttentionMonitor warn_from_epoch", warn_from_epoch, 0)
        for name, value in (("health_batches", health_batches), ("health_rows", health_rows)):
            if value is not None:  # None: all of them
                check_whole_number(f"AttentionMonitor {name} (null: all)", value, 1)
        self.check_texts, self.health_rows = check_texts, health_rows
        self.warn, self.warn_from_epoch = warn, warn_from_epoch
        self.health = AttentionHealth(rows_per_batch=health_rows)
        self.dynamics = TrainingDynamics()
        self.loss_contract = LossContract()
        self.check_batches = []  # the validation sample the model checks run on, gathered during the pass
        self.check_limit = check_texts
        self.findings: list[Finding] = []  # the latest validation pass's findings
        self.history: list[dict] = []  # {"step", "epoch", "findings": [Finding, ...]} per validation epoch
        self.figures = None  # the latest HealthFigures, for scripts and tests
        self.last_probe_step = -1
        self.said_no_tensorboard = False

    # ---- health -------------------------------------------------------------------------------------------------

    def setup(self, trainer, pl_module, stage):
        pl_module.keep_validation_attention = True  # validation_step hands out what its layers computed
        # The keys a query can see: the look-ahead its layers ask for (the config's causal, a user's causal class)
        self.health = AttentionHealth(rows_per_batch=self.health_rows, causal=asks_look_ahead(pl_module.model))

    def teardown(self, trainer, pl_module, stage):
        pl_module.keep_validation_attention = False

    def on_validation_epoch_start(self, trainer, pl_module):
        self.health.reset()
        self.check_batches = []
        self.correct = self.seen = 0
        self.val_labels = self.val_hits = None  # texts and right answers of each class (one label a text)
        # The checks cost forward_passes() forward passes over their texts: at most CHECK_SHARE of the training
        # work (a forward and a backward pass, about 3 forward passes, per text) since the last validation. (The
        # contract checks read a fixed CONTRACT_TEXTS texts on top: bench/monitor_cost.py measures both.)
        passes = forward_passes(pl_module.model)
        trained = self.dynamics.texts
        budget = max(MIN_CHECK_TEXTS, int(CHECK_SHARE * 3 * trained / passes)) if trained else self.check_texts
        self.check_limit = min(self.check_texts, budget)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if trainer.sanity_checking or not trainer.is_global_zero or dataloader_idx != 0:
            return  # under DDP the figures cover rank zero's share of the validation set
        held = sum(len(b["labels"]) for b in self.check_batches)
        if held < self.check_limit and "labels" in batch:  # a pretraining batch has no labels to lose
            self.check_batches.append({key: batch[key][: self.check_limit - held]
                                       for key in ("input_ids", "padding_mask", "labels")})
        logits = outputs.get("logits") if isinstance(outputs, dict) else None
        # for not-learning: each class's texts and right answers, for balanced accuracy (one label a text only)
        if logits is not None and "labels" in batch and batch["labels"].ndim == 1:
            labels = batch["labels"]
            right = logits.argmax(-1) == labels
            self.correct += int(right.sum())
            self.seen += len(labels)
            counts = torch.bincount(labels, minlength=logits.shape[-1])
            hits = torch.bincount(labels[right], minlength=logits.shape[-1])
            self.val_labels = counts if self.val_labels is None else self.val_labels + counts
            self.val_hits = hits if self.val_hits is None else self.val_hits + hits
        if self.health_batches is not None and batch_idx >= self.health_batches:
            return
        attention = outputs.get("attention") if isinstance(outputs, dict) else None
        if attention is None:
            raise RuntimeError("AttentionMonitor needs a LightningModule whose validation_step returns "
                               "{'attention': ...} when keep_validation_attention is set (training/module.py)")
        self.health.update(attention, batch["padding_mask"])

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking or not trainer.is_global_zero or self.health.sums is None:
            return
        figures = self.figures = self.health.compute()
        self.health.reset()
        network = pl_module.model
        # The checks that run the model need a classifier's loss: a pretraining network has no labels to lose.
        classifier = getattr(pl_module, "label_names", None) is not None and hasattr(network, "head")
        measured = {}
        configured = getattr(pl_module, "configured_optimizer", None)
        if configured is not None and trainer.state.fn == "fit" and trainer.optimizers:
            trained, settings = configured()
            measured["optimizer"] = optimizer_differences(trained, trainer.optimizers, settings)
        dynamics = self.dynamics.summary()
        if dynamics:
            dynamics["loss"] = self.loss_contract.summary()
        if dynamics and self.seen:
            dynamics |= {"epoch": trainer.current_epoch, "step": trainer.global_step,
                         "val_accuracy": self.correct / self.seen,
                         "majority_rate": float(self.val_labels.max()) / self.seen,
                         "balanced_accuracy": (self.val_hits / self.val_labels)[self.val_labels > 0].mean().item(),
                         "classes_seen": int((self.val_labels > 0).sum())}
        sample = self.check_batches if classifier and self.check_batches else None
        subject = Subject(model=network if sample else None, sample=sample, figures=figures, dynamics=dynamics,
                          config=getattr(network, "config", None), measured=measured)
        measured_by_check, self.findings = examine(subject)  # every registered check (monitor/units.py)
        checks = {name: value for each in measured_by_check.values() for name, value in each.items()}
        self.check_batches = []
        step = trainer.global_step
        # The training figures go with the findings: diagnose.py reads a checkpoint's not-learning cause from them.
        learning = {name: float(dynamics[name]) for name in LEARNING_FIGURES if name in dynamics}
        self.history.append({"step": step, "epoch": trainer.current_epoch, "findings": self.findings,
                             "figures": learning})
        self.log_scalars(trainer, figures, checks, dynamics)
        writer = self.tensorboard(trainer)
        if writer is not None:
            for layer in range(len(figures.entropy)):
                sample = figures.weight_sample[layer]
                sample = sample[~sample.isnan()]  # a pruned layer's missing heads are NaN rows
                if sample.numel():  # none when no query had two keys (max_length 1)
                    writer.add_histogram(f"attention_health/weights/layer{layer}", sample, step)
            writer.add_text("attention_health/verdicts",
                            verdict_table_markdown(self.findings) + "\n\n" + figure_table_markdown(figures), step)
            if trainer.state.fn != "fit" or step != self.last_probe_step:
                self.heatmaps.log(trainer, pl_module, writer, self.findings if self.history else None)
                self.last_probe_step = step
        if self.warn and self.trained_enough(trainer):
            noted = self.__dict__.setdefault("notes_logged", set())  # a note says the same at every validation
            for finding in self.findings:
                line = finding.line()
                if finding.severity == "warning":
                    log.warning("%s", line)
                elif line not in noted:  # once per run; TensorBoard's verdict text keeps every epoch's
                    noted.add(line)
                    log.info("%s", line)

    def log_scalars(self, trainer, figures, checks: dict, dynamics: dict) -> None:
        scalars = {
            f"attention_health/{name}/layer{layer}_head{head}": float(getattr(figures, name)[layer, head])
            for name in SHOWN_FIGURES
            for layer in range(len(figures.entropy))
            for head in range(figures.heads_of(layer))
        }
        for layer, row in enumerate(checks.get("head_loss_delta", [])):
            scalars |= {f"attention_health/head_loss_delta/layer{layer}_head{head}": v for head, v in enumerate(row)}
        for layer in range(len(figures.entropy)):
            heads = figures.heads_of(layer)
            if heads > 1:
                correlation = figures.score_correlation[layer, :heads, :heads].clone().fill_diagonal_(math.nan)
                scalars[f"attention_doctor/score_correlation/layer{layer}"] = float(correlation.nan_to_num(-1).max())
        for name in ("order_sensitivity", "position_sensitivity", "unsteady_loss"):
            scalars[f"attention_doctor/{name}"] = float(checks.get(name, math.nan))
        for layer, result in enumerate(checks.get("formula", [])):  # the contract: 0 up to rounding
            scalars[f"attention_doctor/formula_difference/layer{layer}"] = float(result["largest"])
        for block, result in enumerate(checks.get("blocks", [])):
            scalars[f"attention_doctor/block_difference/layer{block}"] = float(result["largest"])
        for name, delta in checks.get("invariance", {}).items():
            scalars[f"attention_doctor/invariance_{name}"] = float(delta)
        scalars |= {f"attention_doctor/{name}": float(value) for name, value in dynamics.items()
                    if isinstance(value, (int, float)) and name != "step"}  # the step is the x axis already
        scalars = {name: value for name, value in scalars.items() if not math.isnan(value)}  # figures a kind has not
        for logger in trainer.loggers:
            logger.log_metrics(scalars, trainer.global_step)

    def state_dict(self) -> dict:
        """The findings of every validation epoch, as plain data (checkpoints load with weights_only)."""
        return {"history": [entry | {"findings": [f.to_dict() for f in entry["findings"]]} for entry in self.history]}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = [entry | {"findings": [Finding.from_dict(f) for f in entry["findings"]]}
                        for entry in state_dict.get("history", [])]
        self.findings = self.history[-1]["findings"] if self.history else []

    def trained_enough(self, trainer) -> bool:
        return trainer.global_step > 0 and trainer.current_epoch >= self.warn_from_epoch

    # ---- probes during training -----------------------------------------------------------------------------------

    def on_train_start(self, trainer, pl_module):
        self.dynamics.watch(pl_module)
        self.loss_contract.watch(pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.loss_contract.before_batch()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        self.dynamics.gradients()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.dynamics.update(outputs, trainer.global_step, len(batch["input_ids"]))
        self.loss_contract.after_batch(outputs, batch, trainer.accumulate_grad_batches)
        config = getattr(pl_module.model, "config", None)
        if "labels" in batch and getattr(pl_module, "label_names", None) is not None and config is not None:
            self.dynamics.count_labels(batch["labels"], config.num_classes)
        step = trainer.global_step
        if self.every_n_train_steps <= 0 or step == 0 or step % self.every_n_train_steps or step == self.last_probe_step:
            return  # the last test skips repeats while gradient accumulation holds the step still
        writer = self.tensorboard(trainer)
        if writer is not None and trainer.is_global_zero:
            self.heatmaps.log(trainer, pl_module, writer, self.findings if self.history else None)
            self.last_probe_step = step

    def tensorboard(self, trainer):
        """The SummaryWriter of the trainer's TensorBoardLogger, or None (images, histograms and text need one)."""
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                return logger.experiment
        if not self.said_no_tensorboard:
            log.info("AttentionMonitor: no TensorBoardLogger, so no heatmaps, histograms or verdict text")
            self.said_no_tensorboard = True
        return None
