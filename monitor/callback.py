"""AttentionMonitor: watch attention while a model trains, in TensorBoard, and say when a head goes wrong.

At the end of every validation epoch (never during the sanity check, whose model has not trained):
    attention/probe_<i>                         a layers × heads heatmap of fixed probe texts (image)
    attention_health/<figure>/layer<l>_head<h>  entropy, max_weight, score_std, distance (mean attention distance
                                                in tokens) over the validation set (scalars),
                                                read from a fixed sample of up to `health_rows` rows per batch
    attention_health/weights/layer<l>           a uniform sample of the attention weights (histogram)
    attention_health/verdicts                   the verdict table, markdown (text)
and one `logging` warning per head whose verdict is not "ok", naming the figure, the likely cause and what to try.

The health figures come from the validation pass itself: while the monitor is attached, `validation_step` asks
the network to hand out the weights and scores its layers computed for that batch (no second forward pass, no
recomputation). No work at all on training batches unless `every_n_train_steps` asks for probe images.
"""

import logging
import math

import torch
import torch.nn.functional as F
from lightning.pytorch import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from data.datamodule import collate
from data.tokenizer import UNK_ID
from model.config import ConfigError
from model.kinds import ATTENTION_KINDS
from monitor.health import AttentionHealth, HealthThresholds, verdict_table_markdown, warning_line
from monitor.heatmap import attention_figure, figure_to_array, shown_weights

log = logging.getLogger(__name__)

FIGURES = ("entropy", "max_weight", "score_std", "distance")
MAX_PROBES, MAX_TOKENS = 64, 256  # probe heatmaps drawn per validation, tokens across one (bounds on figure memory)
TITLE_CHARACTERS = 70


def pick_probes(lengths: list[int], num_probes: int, max_tokens: int) -> list[int]:
    """Indices of `num_probes` texts, evenly spaced through the split, among those of moderate length: between
    the split's 25th and 75th length percentile and at most `max_tokens` (so a heatmap shows the whole text).
    Too few of those: any texts of 2 to `max_tokens` tokens; still too few: any texts."""
    if num_probes <= 0 or not lengths:
        return []
    ranked = sorted(lengths)
    low, high = ranked[len(ranked) // 4], min(ranked[(3 * len(ranked)) // 4], max_tokens)
    candidates = [i for i, n in enumerate(lengths) if low <= n <= high and n >= 2]
    if len(candidates) < num_probes:  # a tiny or oddly shaped split: any text that fits, else any text
        candidates = [i for i, n in enumerate(lengths) if 2 <= n <= max_tokens]
    if len(candidates) < num_probes:
        candidates = list(range(len(lengths)))
    step = len(candidates) / min(num_probes, len(candidates))
    return [candidates[int((k + 0.5) * step)] for k in range(min(num_probes, len(candidates)))]


class AttentionMonitor(Callback):
    def __init__(
        self,
        num_probes: int = 4,
        probe_texts: list[str] | None = None,
        every_n_train_steps: int = 0,
        max_tokens: int = 40,
        health_batches: int | None = None,
        health_rows: int | None = 256,
        uniform_entropy: float = HealthThresholds.uniform_entropy,  # the thresholds' defaults live in health.py
        collapsed_entropy: float = HealthThresholds.collapsed_entropy,
        saturated_score_std: float = HealthThresholds.saturated_score_std,
        saturated_max_weight: float = HealthThresholds.saturated_max_weight,
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
            uniform_entropy: a head is over-uniform at or above this mean normalized entropy.
            collapsed_entropy: a head is collapsed at or below this mean normalized entropy.
            saturated_score_std: a head is saturated at or above this score spread ...
            saturated_max_weight: ... together with at least this mean largest weight.
            warn: log one warning per head whose verdict is not "ok".
            warn_from_epoch: the first training epoch (from 0) whose validation may warn. A model that has taken
                no optimizer step at all never warns: freshly initialised attention is over-uniform by design.
        """
        super().__init__()
        for name, value, least, most in (("num_probes", num_probes, 0, MAX_PROBES),
                                         ("max_tokens", max_tokens, 1, MAX_TOKENS)):
            if not least <= value <= most:  # each probe is a figure of max_tokens × max_tokens cells per head
                raise ConfigError(f"AttentionMonitor {name} must be in {least}..{most}, got {value}")
        self.num_probes, self.probe_texts = num_probes, list(probe_texts or [])
        self.every_n_train_steps, self.max_tokens, self.health_batches = every_n_train_steps, max_tokens, health_batches
        self.thresholds = HealthThresholds(uniform_entropy, collapsed_entropy, saturated_score_std, saturated_max_weight)
        self.warn, self.warn_from_epoch = warn, warn_from_epoch
        self.health = AttentionHealth(rows_per_batch=health_rows)
        self.probes = None  # (batch dict, tokens per probe, title per probe), built on first use
        self.figures = None  # the latest HealthFigures, for scripts and tests
        self.last_probe_step = -1
        self.said_no_tensorboard = False
        self.figures_by_probe = {}  # probe index → its Figure, reused from epoch to epoch

    # ---- probes -------------------------------------------------------------------------------------------------

    def build_probes(self, trainer, pl_module):
        datamodule = trainer.datamodule
        if datamodule is None or not hasattr(datamodule, "tokenizer") or not hasattr(datamodule, "split"):
            log.info("AttentionMonitor: no TextDataModule, so no probe heatmaps (health figures still logged)")
            return None
        tokenizer, max_length = datamodule.tokenizer, pl_module.model.max_length
        label_names = getattr(pl_module, "label_names", [])
        classes = label_names is not None  # a pretraining module has none: its validation texts are unlabeled
        validation = datamodule.split("validation")
        items, titles = [], []
        for i in pick_probes(validation.lengths, self.num_probes, self.max_tokens):
            ids, label = validation[i]
            items.append((ids.long()[:max_length], label))
            label_name = label_names[int(label)] if label_names else int(label)
            origin = f"validation #{i}, label {label_name}" if classes else f"held-out text #{i}"
            titles.append((tokenizer.decode(ids.tolist()), origin))
        for text in self.probe_texts:
            ids = tokenizer.encode(text).ids[:max_length] or [UNK_ID]  # a text of only unknown symbols → [UNK]
            items.append((torch.tensor(ids), torch.tensor(-1)))
            titles.append((text, "from the config"))
        if not items:
            return None
        batch = collate(items)
        tokens = [[tokenizer.id_to_token(int(i)) for i in ids] for ids in batch["input_ids"]]
        return batch, tokens, titles

    @torch.no_grad()
    def log_probes(self, trainer, pl_module, writer) -> None:
        if self.probes is None:
            self.probes = self.build_probes(trainer, pl_module) or False
        if not self.probes:
            return
        batch, tokens, titles = self.probes
        model, was_training = pl_module.model, pl_module.model.training
        model.eval()
        try:
            input_ids, padding_mask = batch["input_ids"].to(pl_module.device), batch["padding_mask"].to(pl_module.device)
            logits, weights = model(input_ids, padding_mask, need_weights=True)
        finally:
            model.train(was_training)
        layers = weights
        # (B, n_layers, H, L, K); a pruned layer's missing heads (layers with fewer heads) are NaN: blank panels
        most = max(layer.weights.shape[1] for layer in layers)
        weights = torch.stack([F.pad(layer.weights.float(), (0, 0, 0, 0, 0, most - layer.weights.shape[1]),
                                     value=math.nan) for layer in layers], dim=1).cpu()
        # A long kind's layout (model/long_attention.py): which token each column is, and sparse's global rows.
        key_positions = global_rows = None
        if ATTENTION_KINDS[model.config.attention].key_layout != "tokens":
            key_positions, global_rows = layers[0].key_positions, layers[0].global_rows
        if global_rows is not None:
            global_rows = torch.stack([F.pad(layer.global_rows.weights.float(),
                                             (0, 0, 0, 0, 0, most - layer.global_rows.weights.shape[1]),
                                             value=math.nan) for layer in layers], dim=1).cpu()
        label_names = getattr(pl_module, "label_names", [])
        probabilities = logits.float().softmax(-1).cpu() if label_names is not None else None
        for i, (text, origin) in enumerate(titles):
            text = text if len(text) <= TITLE_CHARACTERS else text[: TITLE_CHARACTERS - 1] + "…"
            predicted = ""
            if probabilities is not None:
                names = label_names or [str(c) for c in range(probabilities.shape[-1])]
                best = int(probabilities[i].argmax())
                predicted = f"; predicted {names[best]} ({probabilities[i, best]:.2f})"
            title = f'"{text}"\n{origin}{predicted}, step {trainer.global_step}'
            figure = self.probe_figure(
                i, weights[i], tokens[i], title, batch["padding_mask"][i],
                None if key_positions is None else key_positions.cpu(), None if global_rows is None else global_rows[i],
            )
            writer.add_image(f"attention/probe_{i}", figure_to_array(figure), trainer.global_step, dataformats="HWC")

    def probe_figure(self, i: int, weights: torch.Tensor, tokens: list[str], title: str, key_padding_mask,
                     key_positions=None, global_weights=None):
        """The probe's heatmap. A probe's tokens never change, so after its first drawing the figure is kept with
        its layout frozen and only the weights and the title are replaced: laying out the token labels is most of
        the cost of a drawing (measured: a redraw takes about half the time of a fresh figure).
        weights (n_layers, H, L, K) in the layer's layout; key_positions and global_weights as attention_figure."""
        if i not in self.figures_by_probe:
            figure = attention_figure(weights, tokens, title, self.max_tokens, key_padding_mask, key_positions,
                                      global_weights)
            figure_to_array(figure)  # lays it out once
            figure.set_layout_engine("none")
            self.figures_by_probe[i] = figure
            return figure
        figure = self.figures_by_probe[i]
        shown, n, _ = shown_weights(weights, self.max_tokens, key_padding_mask, key_positions, global_weights)
        images = [ax.images[0] for ax in figure.axes if ax.images]  # layer by layer, head by head
        for image, head_weights in zip(images, shown.flatten(0, 1).numpy()):
            image.set_data(head_weights)
        if shown.shape[-2] < n:
            title += f" (first {shown.shape[-2]} of {n} tokens)"
        if key_positions is not None and bool((torch.as_tensor(key_positions) < 0).all()):
            title += f", over {shown.shape[-1]} projected keys"
        figure.suptitle(title, fontsize=10)  # replaces the text of the existing title
        return figure

    # ---- health -------------------------------------------------------------------------------------------------

    def setup(self, trainer, pl_module, stage):
        pl_module.keep_validation_attention = True  # validation_step hands out what its layers computed

    def teardown(self, trainer, pl_module, stage):
        pl_module.keep_validation_attention = False

    def on_validation_epoch_start(self, trainer, pl_module):
        self.health.reset()

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if trainer.sanity_checking or not trainer.is_global_zero or dataloader_idx != 0:
            return  # under DDP the figures cover rank zero's share of the validation set
        if self.health_batches is not None and batch_idx >= self.health_batches:
            return
        attention = outputs.get("attention") if isinstance(outputs, dict) else None
        if attention is None:
            raise RuntimeError("AttentionMonitor needs a LightningModule whose validation_step returns "
                               "{'attention': ...} when keep_validation_attention is set (training/module.py)")
        key_layout = ATTENTION_KINDS[pl_module.model.config.attention].key_layout
        self.health.update(attention, batch["padding_mask"], key_layout=key_layout)

    def on_validation_epoch_end(self, trainer, pl_module):
        if trainer.sanity_checking or not trainer.is_global_zero or self.health.sums is None:
            return
        figures = self.figures = self.health.compute()
        self.health.reset()
        step = trainer.global_step
        verdicts = figures.verdicts(self.thresholds)
        scalars = {
            f"attention_health/{name}/layer{layer}_head{head}": float(getattr(figures, name)[layer, head])
            for name in FIGURES
            for layer in range(len(verdicts))
            for head in range(len(verdicts[layer]))
        }
        scalars = {name: value for name, value in scalars.items() if not math.isnan(value)}  # linformer's distance
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step)
        writer = self.tensorboard(trainer)
        if writer is not None:
            for layer in range(len(verdicts)):
                sample = figures.weight_sample[layer]
                sample = sample[~sample.isnan()]  # a pruned layer's missing heads are NaN rows
                if sample.numel():  # none when no query had two keys (max_length 1)
                    writer.add_histogram(f"attention_health/weights/layer{layer}", sample, step)
            writer.add_text("attention_health/verdicts", verdict_table_markdown(figures, self.thresholds), step)
            if trainer.state.fn != "fit" or step != self.last_probe_step:
                self.log_probes(trainer, pl_module, writer)
                self.last_probe_step = step
        if self.warn and self.trained_enough(trainer):
            for layer, heads in enumerate(verdicts):
                for head, name in enumerate(heads):
                    if name != "ok":
                        log.warning(warning_line(layer, head, name, figures))

    def trained_enough(self, trainer) -> bool:
        return trainer.global_step > 0 and trainer.current_epoch >= self.warn_from_epoch

    # ---- probes during training -----------------------------------------------------------------------------------

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if self.every_n_train_steps <= 0 or step == 0 or step % self.every_n_train_steps or step == self.last_probe_step:
            return  # the last test skips repeats while gradient accumulation holds the step still
        writer = self.tensorboard(trainer)
        if writer is not None and trainer.is_global_zero:
            self.log_probes(trainer, pl_module, writer)
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
