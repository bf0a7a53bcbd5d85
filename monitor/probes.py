"""The probe heatmaps of AttentionMonitor (monitor/callback.py): fixed texts (validation texts of moderate length, and
the config's own), drawn as a layers × heads heatmap each, each panel titled with its head's verdict, to TensorBoard.
A probe's figure is laid out once and only its changing parts are drawn again (monitor/heatmap.py freeze, redraw).
"""

import logging

import torch
from matplotlib.text import Text

from data.batches import collate
from data.tokenizer import UNK_ID
from model.config import ConfigError
from monitor.doctor import head_titles
from monitor.heatmap import (PLAIN_TEXT, attention_figure, fitted_heading, freeze, panel_title, redraw,
                             shown_weights)
from monitor.views import stacked_layers

log = logging.getLogger(__name__)

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


class ProbeHeatmaps:
    def __init__(self, num_probes: int, probe_texts: list[str] | None, max_tokens: int):
        """num_probes validation texts and `probe_texts`, at most max_tokens tokens of each (AttentionMonitor's
        arguments of these names)."""
        for name, value, least, most in (("num_probes", num_probes, 0, MAX_PROBES),
                                         ("max_tokens", max_tokens, 1, MAX_TOKENS)):
            if not least <= value <= most:  # each probe is a figure of max_tokens × max_tokens cells per head
                raise ConfigError(f"AttentionMonitor {name} must be in {least}..{most}, got {value}")
        self.num_probes, self.probe_texts, self.max_tokens = num_probes, list(probe_texts or []), max_tokens
        self.probes = None  # (batch dict, tokens per probe, title per probe), built on first use
        self.figures_by_probe = {}  # probe index → its Figure, reused from epoch to epoch
        self.still_parts = {}  # probe index → (its background, the artists drawn over it each time)

    def build(self, trainer, pl_module):
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
            if label.ndim:  # several labels a text (multi-hot)
                label_name = "{" + ", ".join(label_names[c] for c in label.nonzero().flatten().tolist()) + "}"
            else:
                label_name = label_names[int(label)] if label_names else int(label)
            origin = f"validation #{i}, label {label_name}" if classes else f"held-out text #{i}"
            titles.append((tokenizer.decode(ids.tolist()), origin))
        for text in self.probe_texts:
            ids = tokenizer.encode(text).ids[:max_length] or [UNK_ID]  # a text of only unknown symbols → [UNK]
            no_label = torch.full_like(validation.labels[0], -1) if len(validation) else torch.tensor(-1)
            items.append((torch.tensor(ids), no_label))
            titles.append((text, "from the config"))
        if not items:
            return None
        batch = collate(items)
        tokens = [[tokenizer.id_to_token(int(i)) for i in ids] for ids in batch["input_ids"]]
        return batch, tokens, titles

    @torch.no_grad()
    def log(self, trainer, pl_module, writer, findings) -> None:
        """Each probe's heatmap to TensorBoard at this step, its panels titled with `findings`' verdicts (None: the
        model is not judged yet)."""
        if self.probes is None:
            self.probes = self.build(trainer, pl_module) or False
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
        # (B, n_layers, H, L, K), a pruned layer's missing heads NaN (blank panels); a long kind's key positions and
        # sparse's global rows
        weights, key_positions, global_rows = stacked_layers(layers)
        label_names = getattr(pl_module, "label_names", [])
        heads = [layer.weights.shape[1] for layer in layers]
        verdicts = head_titles(findings, heads) if findings is not None else [["not judged yet"] * n for n in heads]
        if label_names is None:
            probabilities = None
        elif hasattr(pl_module, "probabilities"):  # calibrated: softmax / temperature, or a sigmoid per label
            probabilities = pl_module.probabilities(logits).cpu()
        else:
            probabilities = logits.float().softmax(-1).cpu()
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
                key_positions, None if global_rows is None else global_rows[i],
                verdicts,
            )
            pixels = redraw(figure, *self.still_parts[i])
            writer.add_image(f"attention/probe_{i}", pixels, trainer.global_step, dataformats="HWC")

    def probe_figure(self, i: int, weights: torch.Tensor, tokens: list[str], title: str, key_padding_mask,
                     key_positions=None, global_weights=None, verdicts=None):
        """The probe's heatmap, each panel titled with its head's verdict (verdicts[layer][head]). A probe's tokens
        never change, so the figure is laid out and its still parts (tick labels, colour bar) drawn once, kept as a
        background (`still_parts`, heatmap.freeze); later only the weights and the titles are replaced, and
        log draws just those over the background (heatmap.redraw): drawing the token labels is most of the
        cost of a drawing (measured on the SST-2 network, 2 layers × 4 heads, 40 tokens: 0.26 s a full drawing,
        0.02 s the redraw; docs/DOCTOR.md "What it costs").
        weights (n_layers, H, L, K) in the layer's layout; key_positions and global_weights as attention_figure."""
        if i not in self.figures_by_probe:
            # The layout is frozen after this drawing, so each panel gets its two-line title now, even before the
            # first verdicts: a title that grows later would run into the figure's heading.
            layout_titles = verdicts or [["not judged yet"] * weights.shape[1]] * weights.shape[0]
            figure = attention_figure(weights, tokens, title, self.max_tokens, key_padding_mask, key_positions,
                                      global_weights, layout_titles)
            heading = next(text for text in figure.findobj(Text) if text.get_text() == figure.get_suptitle())
            # Drawn each time, in a full drawing's order: each panel's weights, its frame over them, its title.
            changing = [heading] + [artist for ax in figure.axes if ax.images
                                    for artist in (ax.images[0], *ax.spines.values(), ax.title)]
            self.still_parts[i] = (freeze(figure, changing), changing)
            self.figures_by_probe[i] = figure
            return figure
        figure = self.figures_by_probe[i]
        shown, n, _ = shown_weights(weights, self.max_tokens, key_padding_mask, key_positions, global_weights)
        panels = [ax for ax in figure.axes if ax.images]  # layer by layer, head by head
        for k, (ax, head_weights) in enumerate(zip(panels, shown.flatten(0, 1).numpy())):
            ax.images[0].set_data(head_weights)
            layer, head = divmod(k, shown.shape[1])
            ax.set_title(panel_title(layer, head, verdicts), fontsize=8, **PLAIN_TEXT)
        if shown.shape[-2] < n:
            title += f" (first {shown.shape[-2]} of {n} tokens)"
        if key_positions is not None and bool((torch.as_tensor(key_positions) < 0).all()):
            title += f", over {shown.shape[-1]} projected keys"
        # The heading keeps the place the layout gave it: a new suptitle() would go back to matplotlib's default height
        # and run into the panel titles.
        heading = self.still_parts[i][1][0]
        heading.set_text(fitted_heading(title, figure.get_figwidth()))
        return figure
