"""Attention heatmaps: one example's weights as a grid of layers × heads, query rows × key columns, on 0-1.

What is drawn, for a text of any length: the first `max_tokens` tokens (40 by default) and no more, so a review of
2,000 tokens gives a readable 40 × 40 image, never a 2,000 × 2,000 one. Full, local and sparse attention: the
token × token matrix of those tokens (query rows, key columns); local attention shows as a band around the
diagonal, sparse as that band plus the columns (and rows) of its global tokens; weights on keys past the window
are not drawn, so a row may sum to less than 1. Linformer: those tokens' rows over the k projected keys (columns
"E·K 0" …), as its weights are (L × k). The title says how many tokens the text has.

Headless by construction: figures are `matplotlib.figure.Figure` objects drawn by the Agg canvas, never pyplot,
so nothing needs a display and nothing stays registered in pyplot's global figure list.
Chinese (and other CJK) tokens are drawn with a CJK font when one is installed, as a per-glyph fallback after
DejaVu Sans, so Latin text looks the same either way.
"""

import functools
import logging
import math
import re
import textwrap
from pathlib import Path

import numpy as np
import torch
from matplotlib import font_manager, rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from data.files import write_atomically
from monitor.views import dense_window

log = logging.getLogger(__name__)

# Family names of common CJK fonts, in order of preference, and the file names they ship under.
CJK_FAMILY_HINTS = (
    "Noto Sans CJK", "Noto Sans SC", "Source Han Sans", "WenQuanYi", "Droid Sans Fallback", "AR PL",
    "SimHei", "Microsoft YaHei", "PingFang", "Hiragino Sans GB", "Heiti", "Noto Serif CJK",
)
CJK_FILE_HINTS = (
    "notosanscjk", "notosanssc", "sourcehansans", "wqy", "droidsansfallback", "uming", "ukai",
    "simhei", "msyh", "pingfang", "hiragino", "stheiti", "notoserifcjk",
)
CJK_CHARACTERS = re.compile("[\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")  # Han, kana, Hangul, full-width
LABEL_FONT_SIZE = 7  # at 100+ dpi, the smallest size at which a Chinese character stays legible
INCHES_PER_TOKEN = 0.15  # one label line at LABEL_FONT_SIZE points, with a little air
MAX_LABEL_CHARACTERS = 14
# Every text a user wrote (tokens, titles, label names) is drawn as typed: matplotlib would otherwise read a pair of
# dollar signs as a formula (`paid $5 ^_^ worth $10` is a "Double superscript" error), so every Text of a figure
# gets these properties.
PLAIN_TEXT = {"parse_math": False}


def _installed_cjk_family() -> str | None:
    names = {entry.name for entry in font_manager.fontManager.ttflist}
    for hint in CJK_FAMILY_HINTS:
        for name in sorted(names):
            if hint.lower() in name.lower() and "mono" not in name.lower():
                return name
    return None


@functools.cache
def find_cjk_font() -> str | None:
    """The family name of an installed CJK font, or None.

    Matplotlib's font list is cached on disk and misses fonts installed after the cache was built, so when the
    list has none, system font files with a CJK-looking name are added to it (in memory only) and it is asked again.
    """
    family = _installed_cjk_family()
    if family is None:
        for path in font_manager.findSystemFonts():
            if any(hint in Path(path).name.lower().replace("-", "").replace("_", "") for hint in CJK_FILE_HINTS):
                try:
                    font_manager.fontManager.addfont(path)
                except (OSError, RuntimeError, ValueError):  # an unreadable or unsupported font file
                    continue
        family = _installed_cjk_family()
    return family


@functools.cache
def _warn_no_cjk_font() -> None:
    log.warning("no CJK font found; Chinese tokens in attention heatmaps will show as boxes "
                "(install one, e.g. `apt-get install fonts-wqy-microhei`, see scripts/install_cjk_font.sh)")


def font_families(texts) -> list[str]:
    """DejaVu Sans, then the CJK font if there is one; warns once when CJK text is asked for and none exists."""
    cjk = find_cjk_font()
    if cjk is None:
        if any(CJK_CHARACTERS.search(text) for text in texts):
            _warn_no_cjk_font()
        return ["DejaVu Sans"]
    return ["DejaVu Sans", cjk]


def shorten(token: str) -> str:
    return token if len(token) <= MAX_LABEL_CHARACTERS else token[: MAX_LABEL_CHARACTERS - 1] + "…"


def shown_weights(
    weights, max_tokens: int, key_padding_mask=None, key_positions=None, global_weights=None
) -> tuple[torch.Tensor, int, bool]:
    """What a heatmap draws: (n_layers, H, m, m) over the first m = min(real tokens, max_tokens) real tokens, or
    (n_layers, H, m, k) for projected keys; also the number of real tokens and whether the keys are projected.

    weights: (n_layers, H, L, K) in the layer's own key layout; (H, L, K) is read as one layer. key_positions: (L, K)
    token of each column (model/long_attention.py), None for full attention (K = L). global_weights: the sparse
    kind's global rows (n_layers, H, g, L). key_padding_mask: (L,) bool, True = padding, which must come last for a
    long kind (as the data module pads)."""
    weights = (weights if torch.is_tensor(weights) else torch.as_tensor(np.asarray(weights))).detach().float().cpu()
    if weights.dim() == 3:
        weights = weights[None]
    if weights.dim() != 4 or (key_positions is None and weights.shape[-1] != weights.shape[-2]):
        raise ValueError(f"weights must be (n_layers, H, L, L), got shape {tuple(weights.shape)}")
    real = None if key_padding_mask is None else ~torch.as_tensor(key_padding_mask, dtype=torch.bool).cpu()
    if key_positions is None:
        if real is not None:
            weights = weights[:, :, real][:, :, :, real]
        n = weights.shape[-1]
        return weights[:, :, :max_tokens, :max_tokens], n, False
    n = weights.shape[-2] if real is None else int(real.sum())  # real tokens come first
    key_positions = torch.as_tensor(key_positions).cpu()
    if global_weights is not None:
        global_weights = torch.as_tensor(global_weights).detach().float().cpu()
        global_weights = global_weights[None] if global_weights.dim() == 3 else global_weights
    window = dense_window(weights[:, :, :n], key_positions[:n], 0, max_tokens, global_weights)
    return window, n, bool((key_positions < 0).all())


def attention_figure(
    weights,
    tokens: list[str],
    title: str | None = None,
    max_tokens: int = 40,
    key_padding_mask=None,
    key_positions=None,
    global_weights=None,
    verdicts: list[list[str]] | None = None,
) -> Figure:
    """A grid of heatmaps, one per (layer, head), for a single example; verdicts[layer][head] (monitor/doctor.py's
    head_titles) goes under each panel's title.

    weights: (n_layers, H, L, L) tensor or array, query rows × key columns; (H, L, L) is read as one layer; or a
    long kind's own layout (n_layers, H, L, K) with its key_positions (L, K) (and the sparse kind's global_weights),
    see shown_weights. tokens: the L token strings. key_padding_mask: optional (L,) bool, True = padding; those
    rows, columns and tokens are dropped first. Beyond max_tokens tokens, only the first max_tokens are drawn and
    the title says so.
    """
    weights, L, virtual = shown_weights(weights, max_tokens, key_padding_mask, key_positions, global_weights)
    tokens = list(tokens)
    if key_padding_mask is not None:
        real = ~torch.as_tensor(key_padding_mask, dtype=torch.bool).cpu()
        tokens = [token for token, keep in zip(tokens, real.tolist()) if keep]
    n_layers, n_heads, shown, n_keys = weights.shape
    if len(tokens) != L:
        raise ValueError(f"{len(tokens)} tokens for attention over {L} positions")

    weights, labels = weights.numpy(), [shorten(token) for token in tokens[:shown]]
    key_labels = [f"E·K {r}" for r in range(n_keys)] if virtual else labels
    heading = title or "attention weights"
    if shown < L:
        heading += f" (first {shown} of {L} tokens)"
    if virtual:
        heading += f", over {n_keys} projected keys"

    # Each heatmap gets room for its cells plus its token labels on the left and below.
    label_inches = 0.08 * max((len(label) for label in labels), default=1) + 0.4
    cell_inches = max(1.6, INCHES_PER_TOKEN * shown)
    # Projected keys get narrower columns, every `key_step`-th labelled: k may be 128 or more.
    key_step = max(1, math.ceil(n_keys / 32)) if virtual else 1
    width_inches = max(1.6, INCHES_PER_TOKEN * n_keys / key_step) if virtual else cell_inches
    size = (n_heads * (width_inches + label_inches) + 1.0, n_layers * (cell_inches + label_inches + 0.3) + 0.6)
    with rc_context({"font.family": font_families([heading, *labels]), "font.size": 8}):
        fig = Figure(figsize=size, layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(n_layers, n_heads, squeeze=False)
        for layer in range(n_layers):
            for head in range(n_heads):
                ax = axes[layer, head]
                image = ax.imshow(weights[layer, head], vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest",
                                  aspect="auto" if virtual else "equal")
                ax.set_title(panel_title(layer, head, verdicts), fontsize=8, **PLAIN_TEXT)
                # Token labels on the outer edge of the grid only: every heatmap has the same tokens in the same
                # places, and drawing hundreds of labels is most of the cost of an image.
                # An inner panel gets no ticks at all: each tick is an object to lay out, even unlabelled.
                columns = range(0, n_keys, key_step)
                if layer == n_layers - 1:
                    ax.set_xticks(columns, [key_labels[c] for c in columns], rotation=90, fontsize=LABEL_FONT_SIZE,
                                  **PLAIN_TEXT)
                else:
                    ax.set_xticks([])
                if head == 0:
                    ax.set_yticks(range(shown), labels, fontsize=LABEL_FONT_SIZE, **PLAIN_TEXT)
                else:
                    ax.set_yticks([])
                ax.tick_params(length=0, pad=1)
        axes[-1, 0].set_xlabel("key", fontsize=8)
        axes[-1, 0].set_ylabel("query", fontsize=8)
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=min(1.0, 0.9 / math.sqrt(n_layers)), label="weight")
        fig.suptitle(fitted_heading(heading, size[0]), fontsize=10, **PLAIN_TEXT)
    return fig


def fitted_heading(heading: str, figure_width: float) -> str:
    """The figure's heading broken into lines that fit its width (10-point text, ~12 characters an inch): a one-head
    figure is narrower than a probe text's heading, which would otherwise be cut at both sides."""
    width = max(20, int(figure_width * 12))
    return "\n".join(textwrap.fill(line, width) for line in heading.split("\n"))


def panel_title(layer: int, head: int, verdicts: list[list[str]] | None = None) -> str:
    """"layer 0 · head 1", and on a second line the head's verdict when there are verdicts."""
    title = f"layer {layer} · head {head}"
    if verdicts is None or layer >= len(verdicts) or head >= len(verdicts[layer]):
        return title
    return f"{title}\n{verdicts[layer][head]}"


def figure_to_array(fig: Figure) -> np.ndarray:
    """(H, W, 3) uint8 RGB, e.g. for `SummaryWriter.add_image(tag, array, step, dataformats="HWC")`."""
    canvas = fig.canvas if isinstance(fig.canvas, FigureCanvasAgg) else FigureCanvasAgg(fig)
    canvas.draw()
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def freeze(fig: Figure, changing: list) -> object:
    """Lays the figure out for good and draws its still parts once (tick labels, colour bar: most of the cost of a
    drawing), everything but the `changing` artists; returns those pixels, the background `redraw` pastes."""
    for artist in changing:
        artist.set_animated(True)  # a full drawing leaves animated artists out
    try:
        fig.canvas.draw()
    finally:
        for artist in changing:
            artist.set_animated(False)
    fig.set_layout_engine("none")  # the background holds this layout: it must not move
    return fig.canvas.copy_from_bbox(fig.bbox)


def redraw(fig: Figure, background, changing: list) -> np.ndarray:
    """The figure as figure_to_array gives it, drawing only the `changing` artists (in their order) over the
    background `freeze` kept of the rest."""
    canvas = fig.canvas
    canvas.restore_region(background)
    renderer = canvas.get_renderer()
    for artist in changing:
        artist.draw(renderer)
    return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def save_png(fig: Figure, path, dpi: int = 150) -> Path:
    """The figure as a PNG file, written atomically (data/files.py: WriteError, one line, on failure)."""
    return write_atomically(path, lambda temporary: fig.savefig(temporary, format="png", dpi=dpi), "heatmap")
