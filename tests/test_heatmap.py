"""Attention heatmaps render headless, label the tokens, truncate long inputs and draw Chinese as glyphs."""

import logging
import warnings

import numpy as np
import pytest
import torch
from matplotlib import font_manager
from matplotlib.ft2font import FT2Font
from PIL import Image

import monitor.heatmap as heatmap
from model.config import ConfigError
from monitor.heatmap import attention_figure, figure_to_array, find_cjk_font, save_png

TOKENS = ["[CLS]", "我", "喜欢", "这部", "电影", "but", "the", "ending", "drags"]


def random_attention(n_layers, n_heads, L, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(n_layers, n_heads, L, L, generator=generator).mul(2).softmax(-1)


def heatmap_axes(fig):
    return [ax for ax in fig.axes if ax.images and ax.get_title().startswith("layer")]


def draw_and_collect_glyph_warnings(fig):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        figure_to_array(fig)
    return [str(w.message) for w in caught if "missing from font" in str(w.message)]


def test_one_heatmap_per_layer_and_head_on_a_fixed_scale():
    fig = attention_figure(random_attention(2, 3, len(TOKENS)), TOKENS, title="example")
    axes = heatmap_axes(fig)
    assert len(axes) == 2 * 3
    assert [ax.get_title() for ax in axes[:4]] == ["layer 0 · head 0", "layer 0 · head 1", "layer 0 · head 2",
                                                 "layer 1 · head 0"]
    assert all(ax.images[0].get_clim() == (0.0, 1.0) for ax in axes)
    assert len(fig.axes) == len(axes) + 1  # and a single colorbar
    assert fig.get_suptitle() == "example"


def test_tick_labels_are_the_tokens_on_the_outer_edge_of_the_grid():
    fig = attention_figure(random_attention(2, 2, len(TOKENS)), TOKENS)
    axes = heatmap_axes(fig)  # layer by layer, head by head
    for index, ax in enumerate(axes):
        layer, head = divmod(index, 2)
        x_labels = [label.get_text() for label in ax.get_xticklabels()]
        y_labels = [label.get_text() for label in ax.get_yticklabels()]
        assert x_labels == (TOKENS if layer == 1 else [])  # keys: along the bottom row; inner panels: no ticks
        assert y_labels == (TOKENS if head == 0 else [])  # queries: down the left column


def test_each_heatmap_shows_its_own_layer_and_head():
    weights = random_attention(2, 2, 5)
    fig = attention_figure(weights, list("abcde"))
    for index, ax in enumerate(heatmap_axes(fig)):
        np.testing.assert_allclose(ax.images[0].get_array(), weights[index // 2, index % 2].numpy(), rtol=1e-6)


def test_long_inputs_show_the_first_tokens_and_say_so():
    tokens = [f"t{i}" for i in range(97)]
    fig = attention_figure(random_attention(1, 1, 97), tokens, title="review 3", max_tokens=40)
    assert fig.get_suptitle() == "review 3 (first 40 of 97 tokens)"
    (ax,) = heatmap_axes(fig)
    assert ax.images[0].get_array().shape == (40, 40)
    assert [label.get_text() for label in ax.get_xticklabels()] == tokens[:40]

    short = attention_figure(random_attention(1, 1, 5), tokens[:5], title="review 3", max_tokens=40)
    assert short.get_suptitle() == "review 3"


def test_padding_mask_drops_padded_rows_columns_and_tokens():
    weights = random_attention(1, 1, 6)
    mask = torch.tensor([False, False, False, True, True, True])
    fig = attention_figure(weights, ["a", "b", "c", "[PAD]", "[PAD]", "[PAD]"], key_padding_mask=mask)
    (ax,) = heatmap_axes(fig)
    np.testing.assert_allclose(ax.images[0].get_array(), weights[0, 0, :3, :3].numpy(), rtol=1e-6)
    assert [label.get_text() for label in ax.get_yticklabels()] == ["a", "b", "c"]


def test_wrong_number_of_tokens_is_a_clear_error():
    with pytest.raises(ValueError, match="3 tokens for attention over 4 positions"):
        attention_figure(random_attention(1, 1, 4), ["a", "b", "c"])


def test_figure_grows_with_tokens_and_heads():
    small = attention_figure(random_attention(1, 1, 5), list("abcde")).get_size_inches()
    wide = attention_figure(random_attention(1, 4, 5), list("abcde")).get_size_inches()
    long = attention_figure(random_attention(1, 1, 30), [f"t{i}" for i in range(30)]).get_size_inches()
    assert wide[0] > 3 * small[0] and long[0] > small[0] and long[1] > small[1]


@pytest.mark.slow
def test_png_and_array_round_trip(tmp_path):
    fig = attention_figure(random_attention(1, 2, len(TOKENS)), TOKENS)
    path = save_png(fig, tmp_path / "attention.png", dpi=80)
    with Image.open(path) as image:
        assert image.format == "PNG"
        width, height = fig.get_size_inches() * 80
        assert abs(image.size[0] - width) <= 1 and abs(image.size[1] - height) <= 1
    array = figure_to_array(fig)
    assert array.dtype == np.uint8 and array.ndim == 3 and array.shape[2] == 3
    width, height = fig.get_size_inches() * fig.dpi
    assert abs(array.shape[0] - height) <= 1 and abs(array.shape[1] - width) <= 1
    assert array.min() < 50 and array.max() > 200  # something was drawn, not a blank canvas


@pytest.mark.skipif(find_cjk_font() is None, reason="no CJK font installed")
def test_chinese_tokens_render_with_the_cjk_font():
    cjk = find_cjk_font()
    cjk_file = font_manager.findfont(font_manager.FontProperties(family=cjk), fallback_to_default=False)
    fig = attention_figure(random_attention(1, 1, len(TOKENS)), TOKENS, title="这部电影")
    (ax,) = heatmap_axes(fig)
    label = ax.get_yticklabels()[2]
    assert label.get_text() == "喜欢" and cjk in label.get_fontfamily()
    assert all(FT2Font(cjk_file).get_char_index(ord(character)) for character in "我喜欢这部电影")
    assert draw_and_collect_glyph_warnings(fig) == []


@pytest.mark.slow
def test_without_a_cjk_font_chinese_falls_back_with_one_warning(monkeypatch, caplog):
    monkeypatch.setattr(heatmap, "find_cjk_font", lambda: None)
    heatmap._warn_no_cjk_font.cache_clear()
    with caplog.at_level(logging.WARNING, logger="monitor.heatmap"):
        figures = [attention_figure(random_attention(1, 1, len(TOKENS)), TOKENS) for _ in range(2)]
    assert len([r for r in caplog.records if "no CJK font" in r.getMessage()]) == 1
    # The control for the test above: without the CJK font the same labels do lose their glyphs.
    assert draw_and_collect_glyph_warnings(figures[0])
    heatmap._warn_no_cjk_font.cache_clear()


def test_latin_tokens_never_warn_about_fonts(monkeypatch, caplog):
    monkeypatch.setattr(heatmap, "find_cjk_font", lambda: None)
    heatmap._warn_no_cjk_font.cache_clear()
    with caplog.at_level(logging.WARNING, logger="monitor.heatmap"):
        fig = attention_figure(random_attention(1, 1, 3), ["the", "ending", "drags"])
    assert not caplog.records and draw_and_collect_glyph_warnings(fig) == []


@pytest.mark.parametrize("option", ["num_probes", "max_tokens"])
def test_monitor_figure_sizes_are_bounded(option):
    from monitor import AttentionMonitor

    with pytest.raises(ConfigError, match=f"AttentionMonitor {option} must be in"):
        AttentionMonitor(**{option: 100000})


PRICES = ["paid", "$5", "^_^", "worth", "$10", "a\\b", "$x$"]


def test_user_text_with_dollar_signs_is_drawn_as_typed_never_as_a_formula():
    """`$5 ^_^ worth $10` would be a mathtext "Double superscript" error; tokens, titles and panel titles stay text."""
    fig = attention_figure(random_attention(1, 2, len(PRICES)), PRICES, title="paid $5 ^_^ worth $10",
                           verdicts=[["$a^_^b$", "ok"]])
    figure_to_array(fig)  # draws every text
    assert fig.get_suptitle() == "paid $5 ^_^ worth $10"
    assert [label.get_text() for label in heatmap_axes(fig)[0].get_yticklabels()] == PRICES


def test_a_long_heading_is_broken_into_lines_a_one_head_figure_can_hold():
    from monitor.heatmap import fitted_heading

    heading = "the chateau cleverly probes the cross - cultural differences between them — validation #331, step 3159"
    figure = attention_figure(torch.rand(2, 1, 6, 6).softmax(-1), [f"t{i}" for i in range(6)], heading)
    lines = figure.get_suptitle().split("\n")
    assert len(lines) > 1 and " ".join(lines) == heading  # every word kept, in order
    assert max(map(len, lines)) <= int(figure.get_figwidth() * 12)
    assert fitted_heading("short", 4.0) == "short"
