"""AttentionMonitor through train.py on the smoke config: what reaches TensorBoard, when, and when it warns."""

import logging

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import train
from conftest import ONE_PROBE, PROBE_TEXT, QUIET, SMOKE, SMOKE_EPOCHS
from monitor.callback import AttentionMonitor
from monitor.health import AttentionHealth
from monitor.heatmap import figure_to_array, redraw
from monitor.probes import pick_probes

FIGURES = ("entropy", "max_weight", "score_std", "gradient_pass", "pad_weight", "row_sum_error")


def run(tmp_path, *extra, subcommand="fit"):
    args = [subcommand, "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"),
            "--trainer.logger.init_args.save_dir", str(tmp_path), *QUIET, *ONE_PROBE, *extra]
    return train.main(args)


def events(tmp_path) -> EventAccumulator:
    (path,) = (tmp_path / "lightning_logs" / "version_0").glob("events.out.tfevents.*")
    accumulator = EventAccumulator(str(path), size_guidance={"images": 0, "scalars": 0, "tensors": 0, "histograms": 0})
    accumulator.Reload()
    return accumulator


def verdict_texts(accumulator) -> list[str]:
    return [e.tensor_proto.string_val[0].decode() for e in accumulator.Tensors("attention_health/verdicts/text_summary")]


def monitor_of(cli) -> AttentionMonitor:
    (monitor,) = [c for c in cli.trainer.callbacks if isinstance(c, AttentionMonitor)]
    return monitor


@pytest.fixture(scope="module")
def monitored_run(smoke_run):
    """The session's smoke run (tests/conftest.py: 1 validation probe and PROBE_TEXT from its config): the fit's
    LightningCLI and its TensorBoard events."""
    return smoke_run.cli, events(smoke_run.root)


def test_probe_images_are_logged_at_each_validation_end_and_not_during_sanity_check(monitored_run):
    cli, accumulator = monitored_run
    assert cli.trainer.num_sanity_val_steps > 0  # a sanity check did run
    steps_per_epoch = cli.trainer.global_step // SMOKE_EPOCHS
    probes = [tag for tag in accumulator.Tags()["images"] if tag.startswith("attention/")]
    assert sorted(probes) == ["attention/probe_0", "attention/probe_1"]
    for tag in ("attention/probe_0", "attention/probe_1"):
        images = accumulator.Images(tag)
        assert [image.step for image in images] == [k * steps_per_epoch for k in range(1, SMOKE_EPOCHS + 1)]
        assert images[-1].encoded_image_string.startswith(b"\x89PNG") and images[-1].width > 200


def test_probe_text_from_the_config_is_drawn_with_the_data_tokenizer(monitored_run):
    cli, _ = monitored_run
    _, tokens, titles = monitor_of(cli).heatmaps.probes
    expected = cli.datamodule.tokenizer.encode(PROBE_TEXT).tokens
    assert titles[1] == (PROBE_TEXT, "from the config")
    assert [t for t in tokens[1] if t != "[PAD]"] == expected


def test_health_scalars_histogram_and_verdicts_reach_tensorboard(monitored_run):
    cli, accumulator = monitored_run
    steps_per_epoch = cli.trainer.global_step // SMOKE_EPOCHS
    heads = cli.model.network.n_heads
    for name in FIGURES:
        for head in range(heads):
            values = accumulator.Scalars(f"attention_health/{name}/layer0_head{head}")
            assert [v.step for v in values] == [k * steps_per_epoch for k in range(1, SMOKE_EPOCHS + 1)]
    entropy = [v.value for v in accumulator.Scalars("attention_health/entropy/layer0_head0")]
    assert all(0.0 < e < 1.0 for e in entropy)
    (histogram,) = accumulator.Histograms("attention_health/weights/layer0")[-1:]
    assert 0.0 <= histogram.histogram_value.min and histogram.histogram_value.max <= 1.0
    final = verdict_texts(accumulator)[-1]
    assert final.count("\n| 0 |") == heads  # one row per head of the one layer


def test_figures_are_the_health_of_the_whole_validation_set(monitored_run):
    """Known answer: the monitor's figures equal AttentionHealth over every validation batch of the final model."""
    cli, _ = monitored_run
    model = cli.model.model.eval()
    health = AttentionHealth()
    with torch.no_grad():
        for batch in cli.datamodule.val_dataloader():
            health.update(model(batch["input_ids"], batch["padding_mask"], need_weights=True).attention,
                          batch["padding_mask"])
    expected, figures = health.compute(), monitor_of(cli).figures
    assert figures.rows == expected.rows == sum(n for n in cli.datamodule.split("validation").lengths if n >= 2)
    for name in FIGURES:
        torch.testing.assert_close(getattr(figures, name), getattr(expected, name))


@pytest.mark.slow
def test_tiny_scale_is_one_scale_warning_for_the_layer_with_its_figures(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="monitor.callback")
    run(tmp_path, "--model.network.scale", "0.0001", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "10")
    warned = [r.getMessage() for r in caplog.records if r.name == "monitor.callback" and r.levelno == logging.WARNING]
    lines = [line for line in warned if line.startswith("attention layer")]
    assert len(lines) == 1, warned  # the one layer, not each head
    assert lines[0].startswith("attention layer 0: scale-too-small (score_std ")
    assert "1/√d_k" in lines[0]
    assert verdict_texts(events(tmp_path))[-1].count("| scale-too-small |") == 1
    # and the setting itself, with its flag (the contract): the model's one other warning
    (setting,) = [line for line in warned if line not in lines]
    assert setting.startswith("attention the model: formula-setting") and "--model.network.scale 0.0001" in setting


@pytest.mark.slow
def test_untrained_model_is_not_warned_about_but_its_verdict_is_logged(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="monitor.callback")
    run(tmp_path, "--model.network.scale", "0.0001", "--trainer.limit_val_batches", "2", subcommand="validate")
    assert not [r for r in caplog.records if r.name == "monitor.callback"]
    assert "| scale-too-small |" in verdict_texts(events(tmp_path))[-1]


@pytest.mark.slow
def test_without_tensorboard_scalars_still_go_to_the_logger(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="monitor.callback")
    run(
        tmp_path, "--model.network.scale", "0.0001", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "5",
        "--trainer.logger", "lightning.pytorch.loggers.CSVLogger", "--trainer.logger.init_args.save_dir", str(tmp_path),
    )
    (metrics,) = tmp_path.glob("lightning_logs/version_0/metrics.csv")
    assert "attention_health/entropy/layer0_head1" in metrics.read_text().splitlines()[0]
    assert any("scale-too-small" in r.getMessage() for r in caplog.records)


def test_probes_are_moderate_length_evenly_spaced_and_deterministic():
    lengths = [1, 30, 5, 6, 7, 8, 50, 6, 7, 2, 9, 100, 6, 8, 7, 3]
    picked = pick_probes(lengths, num_probes=4, max_tokens=40)
    assert picked == pick_probes(lengths, num_probes=4, max_tokens=40)
    assert len(set(picked)) == 4 and picked == sorted(picked)
    assert all(5 <= lengths[i] <= 9 for i in picked)  # between the quartiles: no 1-, 2- or 100-token texts
    assert picked[0] <= len(lengths) // 4 and picked[-1] >= 3 * len(lengths) // 4  # spread through the split
    short = pick_probes(lengths, num_probes=4, max_tokens=6)  # only three moderate texts fit: any that fit
    assert len(short) == 4 and all(2 <= lengths[i] <= 6 for i in short)
    assert pick_probes([4, 4], num_probes=3, max_tokens=40) == [0, 1]  # never more than there are


def test_a_reused_probe_figure_shows_the_new_weights_of_real_tokens_only():
    monitor = AttentionMonitor(max_tokens=5)
    tokens, padding = [f"t{i}" for i in range(8)], torch.arange(8) >= 6  # 6 real tokens, 5 shown
    first, second = torch.rand(2, 3, 8, 8).softmax(-1), torch.rand(2, 3, 8, 8).softmax(-1)
    figure = monitor.heatmaps.probe_figure(0, first, tokens, "epoch 0", padding)
    assert monitor.heatmaps.probe_figure(0, second, tokens, "epoch 1", padding) is figure
    images = [ax.images[0].get_array() for ax in figure.axes if ax.images]
    assert len(images) == 6
    for image, expected in zip(images, second[:, :, :5, :5].flatten(0, 1)):
        assert torch.allclose(torch.as_tensor(image.data), expected)
    assert figure.get_suptitle() == "epoch 1 (first 5 of 6 tokens)"


def test_a_redrawn_probe_has_the_pixels_of_a_full_drawing():
    """log_probes draws only the weights, frames and titles over the background kept of the first drawing."""
    monitor = AttentionMonitor(max_tokens=6)
    tokens, padding = [f"t{i}" for i in range(8)], torch.arange(8) >= 7
    monitor.heatmaps.probe_figure(0, torch.rand(2, 3, 8, 8).softmax(-1), tokens, "epoch 0", padding)
    figure = monitor.heatmaps.probe_figure(0, torch.rand(2, 3, 8, 8).softmax(-1), tokens, "epoch 1, a longer heading",
                                  padding, None, None, [["averaging", "ok", "ok"], ["ok", "unused", "ok"]])
    redrawn = redraw(figure, *monitor.heatmaps.still_parts[0])
    assert (redrawn == figure_to_array(figure)).all()


def test_a_reused_probe_figure_keeps_its_heading_where_the_layout_put_it():
    """The layout is frozen after the first drawing: a new heading takes the old one's place, above the panel titles
    (a fresh suptitle would sit at matplotlib's default height and run into them)."""
    from matplotlib.text import Text

    monitor = AttentionMonitor()
    weights, tokens = torch.rand(2, 4, 24, 24).softmax(-1), [f"t{i}" for i in range(24)]
    figure = monitor.heatmaps.probe_figure(0, weights, tokens, '"a text"\nvalidation #1, step 0', None)
    figure_to_array(figure)
    heading = [t for t in figure.findobj(Text) if t.get_text() == '"a text"\nvalidation #1, step 0']
    (where,) = {t.get_position() for t in heading}
    monitor.heatmaps.probe_figure(0, weights, tokens, '"a text"\nvalidation #1; predicted pos (0.94), step 500', None)
    figure_to_array(figure)
    (moved,) = [t for t in figure.findobj(Text) if t.get_text().endswith("step 500")]
    assert moved.get_position() == where
    panel_tops = [ax.title.get_window_extent().y1 for ax in figure.axes if ax.images]
    assert moved.get_window_extent().y0 > max(panel_tops)  # above every panel title, not over them


def test_a_probe_whose_text_holds_dollar_signs_is_drawn_first_and_on_reuse():
    monitor = AttentionMonitor()
    weights, tokens = torch.rand(1, 2, 4, 4).softmax(-1), ["paid", "$5", "^_^", "$10"]
    figure = monitor.heatmaps.probe_figure(0, weights, tokens, '"paid $5 ^_^ worth $10"\nvalidation #1, step 0', None)
    figure_to_array(figure)
    monitor.heatmaps.probe_figure(0, weights, tokens, '"paid $5 ^_^ worth $10"\nvalidation #2, step 9', None, None,
                         None, [["$a^_^b$", "ok"]])
    figure_to_array(figure)
    assert figure.get_suptitle().endswith("step 9")
