"""End to end through train.py: learning, checkpoints, resuming, bad input, DDP on CPU."""

import json
import os
import subprocess
import sys

import pytest
import torch

import train
import training.commands
from conftest import LABELS, ONE_PROBE, QUIET, ROOT, SMOKE, fit
from inference import TextClassifier
from training.average import WeightAverage


@pytest.mark.slow
def test_smoke_config_learns_the_marker_task(smoke_run):
    """Which marker comes first (or none): only attention between positions tells the first two classes apart."""
    assert smoke_run.cli.trainer.callback_metrics["val/acc"] > 0.9


def test_checkpoints_best_and_last_load_without_running_code(smoke_run):
    checkpoints = sorted((smoke_run.run / "checkpoints").glob("*.ckpt"))
    names = [p.name for p in checkpoints]
    assert "last.ckpt" in names and any(n.startswith("best-") for n in names)
    for path in checkpoints:
        checkpoint = torch.load(path, weights_only=True, map_location="cpu")
        # Self-contained, each fact once: the network's sizes and the label names in the hyperparameters, the
        # tokenizer (without a copy of max_length as its truncation) under the DataModule's name.
        hparams = checkpoint["hyper_parameters"]
        assert hparams["label_names"] == LABELS
        assert hparams["network"]["max_length"] == 24 and hparams["network"]["vocab_size"] == 64
        assert set(hparams) & {"max_length", "vocab_size"} == set()
        assert list(checkpoint["TextDataModule"]) == ["tokenizer"]
        tokenizer = json.loads(checkpoint["TextDataModule"]["tokenizer"])
        assert tokenizer["model"]["type"] == "WordPiece" and tokenizer["truncation"] is None


@pytest.mark.slow
def test_fit_from_a_checkpoint_reads_it_once_before_lightning_does(smoke_run, tmp_path, monkeypatch):
    last = smoke_run.last
    reads = []
    read = training.commands.read_checkpoint
    monkeypatch.setattr(training.commands, "read_checkpoint", lambda path: reads.append(path) or read(path))
    cli = fit(tmp_path, "--data.train_file", str(smoke_run.train_file), "--trainer.max_epochs", "5",
              "--trainer.limit_train_batches", "1",
              "--trainer.limit_val_batches", "1", "--ckpt_path", str(last))
    assert reads == [last] and cli.trainer.current_epoch == 5


def test_model_vocabulary_and_classes_come_from_the_data(smoke_run):
    cli = smoke_run.cli
    assert cli.model.network.vocab_size == cli.datamodule.hparams.vocab_size >= cli.datamodule.tokenizer.get_vocab_size()
    assert cli.model.model.head.out_features == len(LABELS)


@pytest.mark.slow
def test_resume_from_last_continues_the_step_count(tmp_path, caplog):
    short = ["--trainer.limit_train_batches", "5", "--trainer.limit_val_batches", "2"]
    with caplog.at_level("INFO", logger="train"):
        fit(tmp_path, "--trainer.max_epochs", "1", *short)
    (best,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("best checkpoint: ")]
    (path,) = (tmp_path / "lightning_logs" / "version_0" / "checkpoints").glob("best-*.ckpt")
    assert best.startswith(f"best checkpoint: {path} (val/acc ") and 0 <= float(best.split()[-1].rstrip(")")) <= 1
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    steps_after_one_epoch = torch.load(last, weights_only=True)["global_step"]
    assert steps_after_one_epoch == 5
    cli = fit(tmp_path, "--trainer.max_epochs", "2", "--ckpt_path", "last", *short)
    assert cli.trainer.global_step == 2 * steps_after_one_epoch
    assert torch.load(last, weights_only=True)["global_step"] == 2 * steps_after_one_epoch
    assert not (tmp_path / "lightning_logs" / "version_1").exists()  # the same run went on


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, message",
    [
        (["--data.train_file", "missing.csv"], "error: missing.csv: file not found"),
        (["--data.dataset", "sst3"], "error: unknown dataset 'sst3'"),
        (["--data.val_fraction", "0"], "error: val_fraction must be between 0 and 1"),
        (["--model.network.causal", "true", "--model.network.pooling", "first"], "causal: true with pooling: first"),
        (["--model.network.n_heads", "0"], "n_heads must be a whole number >= 1, got 0"),
    ],
)
def test_bad_input_gives_one_line_error_and_nonzero_exit(tmp_path, args, message):
    with pytest.raises(SystemExit) as stop:  # train.main's own exit: what the process prints on stderr
        fit(tmp_path, *args)
    assert message in str(stop.value.code) and "\n" not in str(stop.value.code)


@pytest.mark.slow  # a fresh Python process
def test_no_offline_copy_and_no_network_says_what_to_do(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ATTENTION_DATA_ROOT"}
    env["HF_HUB_OFFLINE"] = "1"  # what an unreachable hub looks like, without waiting for network time-outs
    result = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "fit", "--config", SMOKE, "--data.dataset", "ag_news"],
        cwd=tmp_path, capture_output=True, text=True, env=env,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr  # a real process: one line, no traceback
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: dataset 'ag_news': no local copy (data_dir, or ATTENTION_DATA_ROOT/ag_news)")


@pytest.mark.slow
def test_ema_model_is_the_average_the_checkpoint_keeps(tmp_path):
    cli = fit(tmp_path, "--trainer.max_epochs", "1", "--model.ema_decay", "0.9", "--trainer.limit_train_batches", "10",
              "--trainer.limit_val_batches", "2")
    module = cli.model
    averaged, online = dict(module.model.named_parameters()), dict(module.online_model.named_parameters())
    assert not any(p.requires_grad for p in averaged.values())
    assert not torch.equal(averaged["head.weight"], online["head.weight"])  # an average, not a copy
    checkpoint = torch.load(tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt", weights_only=True)
    torch.testing.assert_close(checkpoint["state_dict"]["model.head.weight"], averaged["head.weight"])
    # The network trained beside it under `_online.`: the layout every EMA checkpoint has, so older ones resume.
    torch.testing.assert_close(checkpoint["state_dict"]["_online.head.weight"], online["head.weight"])


@pytest.mark.slow
def test_weightless_settings_survive_save_and_load(tmp_path):
    """scale, causal, pooling and positions hold no weights: only the stored NetworkConfig can bring them back."""
    cli = fit(
        tmp_path, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "10",
        "--model.network.scale", "0.5", "--model.network.causal", "true", "--model.network.pooling", "max",
        "--model.network.positions", "sinusoidal",
    )
    trained = cli.model.network
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    classifier = TextClassifier.from_checkpoint(last, device="cpu")
    assert classifier.model.config == trained
    assert (trained.scale, trained.causal, trained.pooling, trained.positions) == (0.5, True, "max", "sinusoidal")
    texts = ["alpha w3 beta w7", "beta w1 w2 alpha w9 w4"]
    ids = [cli.datamodule.tokenizer.encode(t).ids for t in texts]
    L = max(map(len, ids))
    input_ids = torch.tensor([i + [0] * (L - len(i)) for i in ids])
    with torch.no_grad():
        expected = cli.model.probabilities(cli.model.eval()(input_ids, input_ids == 0).logits)  # calibrated
    got = [list(p.probabilities.values()) for p in classifier.predict(texts)]
    torch.testing.assert_close(torch.tensor(got), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.slow
def test_default_root_dir_holds_logs_and_checkpoints(tmp_path):
    root = tmp_path / "runs"
    train.main(["fit", "--config", SMOKE, "--data.cache_dir", str(tmp_path / "cache"), *QUIET, *ONE_PROBE,
                "--trainer.default_root_dir", str(root), "--trainer.max_epochs", "1",
                "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "2"])
    assert (root / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt").exists()
    assert (root / "lightning_logs" / "version_0" / "config.yaml").exists()


@pytest.mark.slow
def test_ema_is_updated_once_per_optimizer_step_not_per_micro_batch(tmp_path, monkeypatch):
    updates = []
    original = WeightAverage.update
    monkeypatch.setattr(WeightAverage, "update", lambda self, *args: updates.append(args[1]) or original(self, *args))
    cli = fit(tmp_path, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "8",
              "--trainer.accumulate_grad_batches", "4", "--model.ema_decay", "0.9", "--trainer.limit_val_batches", "1")
    assert cli.trainer.global_step == 2 and updates == [0, 1]  # each with the step count before it


def test_each_epoch_draws_a_new_batch_order(tmp_path, monkeypatch):
    """Lightning reads len(loader) batches and stops: the sampler must not count epochs after its last batch (it did,
    and every epoch repeated the first one's order). Three epochs' first 6 batches: three different orders."""
    import data.batches

    epochs, collated = [], data.batches.collate

    def recording(items):
        batch = collated(items)
        if len(epochs[-1]) < 6:
            epochs[-1].append(tuple(batch["input_ids"].sum(dim=1).tolist()))
        return batch

    monkeypatch.setattr(data.batches, "collate", recording)
    monkeypatch.setattr(data.batches.BucketBatchSampler, "batches",
                        lambda self, real=data.batches.BucketBatchSampler.batches: epochs.append([]) or real(self))
    fit(tmp_path, "--trainer.max_epochs", "3", "--trainer.limit_train_batches", "6", "--trainer.limit_val_batches", "0",
        "--trainer.num_sanity_val_steps", "0")
    assert len(epochs) == 3 and all(len(e) == 6 for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3
