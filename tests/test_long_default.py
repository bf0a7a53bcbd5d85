"""The generic default on long texts: attention "auto" is full attention up to 256 tokens and local attention
beyond, and with data.max_length unset the data read whole long texts (up to 2,048 tokens) when more than 20% of
the training texts are longer than 256 tokens (model/config.py NetworkConfig.resolved, data/sizes.py)."""

import random

import pytest
import torch
from conftest import QUIET, write_csv

import train
from data import TextDataModule
from data.sizes import LONG_TEXT_SHARE, MAX_LENGTH_CAP
from model.classifier import AttentionClassifier
from model.config import FULL_ATTENTION_MAX_LENGTH, LONG_MAX_LENGTH, ConfigError, NetworkConfig, max_length_caps
from model.long_attention import LocalSelfAttention


def review_rows(n: int, long_share: float, long_words=(300, 700), seed: int = 0) -> list[tuple[str, str]]:
    """n texts, a share `long_share` of them longer than 256 words; the label word sits anywhere in the text."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        length = rng.randint(*long_words) if i < long_share * n else rng.randint(10, 100)
        label = rng.choice(["good", "bad"])
        words = [f"w{rng.randrange(50)}" for _ in range(length)]
        words.insert(rng.randrange(length), f"{label}word")
        rows.append((" ".join(words), label))
    rng.shuffle(rows)
    return rows


def data_module(tmp_path, rows, attention, **kwargs) -> TextDataModule:
    train_file = write_csv(tmp_path / f"texts-{attention}.csv", rows)
    return TextDataModule(train_file=str(train_file), tokenizer="word", max_length_caps=max_length_caps(attention),
                          cache_dir=str(tmp_path / "cache"), **kwargs)


@pytest.mark.parametrize(("max_length", "kind"),
                         [(8, "full"), (FULL_ATTENTION_MAX_LENGTH, "full"), (FULL_ATTENTION_MAX_LENGTH + 8, "local")])
def test_auto_is_full_attention_up_to_256_tokens_and_local_beyond(max_length, kind):
    config = NetworkConfig(attention="auto", max_length=max_length, window=8)
    assert config.resolved().attention == kind
    layer = AttentionClassifier(config).blocks[0].attention
    assert isinstance(layer, LocalSelfAttention) == (kind == "local")
    assert AttentionClassifier(config).config.attention == kind  # the network never holds "auto"


def test_auto_checks_the_kind_it_stands_for():
    with pytest.raises(ConfigError, match="window 100000 is larger than max_length 512"):
        NetworkConfig(attention="auto", max_length=512, window=100_000)
    NetworkConfig(attention="auto", max_length=128, window=100_000)  # full attention: the window plays no part
    with pytest.raises(ConfigError, match="attention: full only, not local"):
        NetworkConfig(attention="auto", max_length=512, attention_kernel="fused")


def test_auto_reads_whole_texts_when_many_are_long(tmp_path):
    data = data_module(tmp_path, review_rows(200, long_share=0.5), "auto", bucket_pool=None)
    assert FULL_ATTENTION_MAX_LENGTH < data.max_length <= 8 * -(-701 // 8)  # the longest text, whole
    assert max(data.split("train").lengths) > FULL_ATTENTION_MAX_LENGTH  # not cut at 256
    assert data.bucket_pool == 50  # length-sorted batches for long texts
    assert NetworkConfig(attention="auto", max_length=data.max_length).resolved().attention == "local"


def test_auto_stays_with_full_attention_when_few_texts_are_long(tmp_path):
    share = LONG_TEXT_SHARE / 2
    data = data_module(tmp_path, review_rows(200, long_share=share), "auto", bucket_pool=None)
    assert data.max_length == FULL_ATTENTION_MAX_LENGTH  # the long tenth is cut, as before
    assert data.bucket_pool == 1  # random batches for short texts


@pytest.mark.slow
def test_full_attention_cuts_at_256_and_the_cheaper_kinds_read_up_to_2048(tmp_path):
    rows = review_rows(60, long_share=0.5, long_words=(2500, 3000))
    assert data_module(tmp_path, rows, "full").max_length == FULL_ATTENTION_MAX_LENGTH
    assert data_module(tmp_path, rows, "local").max_length == LONG_MAX_LENGTH
    assert data_module(tmp_path, rows, "full", max_length=100).max_length == 100  # a set max_length is kept


@pytest.mark.slow
def test_no_config_fit_on_long_texts_trains_local_attention_and_reruns_from_its_config(tmp_path):
    train_file = write_csv(tmp_path / "long.csv", review_rows(80, long_share=0.5))
    common = ["--data.cache_dir", str(tmp_path / "cache"), "--trainer.max_epochs", "1", "--trainer.callbacks", "[]",
              "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1", *QUIET]
    train.main(["fit", "--data.train_file", str(train_file), "--trainer.default_root_dir", str(tmp_path), *common])
    run = tmp_path / "lightning_logs" / "version_0"
    checkpoint = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    network = checkpoint["hyper_parameters"]["network"]
    assert network["attention"] == "local" and network["max_length"] > FULL_ATTENTION_MAX_LENGTH
    saved = (run / "config.yaml").read_text()
    assert "attention: auto" in saved and f"max_length: {network['max_length']}" in saved and "bucket_pool: 50" in saved
    # The run's config.yaml builds the same network again: validate the checkpoint with it.
    train.main(["validate", "--config", str(run / "config.yaml"), "--ckpt_path", str(run / "checkpoints" / "last.ckpt"),
                "--trainer.logger", "false", *common])


def test_the_data_alone_cuts_where_full_attention_does_and_refuses_bad_caps():
    """A TextDataModule made without train.py (the Python API) caps like full attention, the network's default."""
    from data import DataError

    assert NetworkConfig().attention == "full" and [MAX_LENGTH_CAP] == max_length_caps("full")
    for caps in ([0], [2048, 256], [1, 2, 3]):
        with pytest.raises(DataError, match=r"data.max_length_caps must be one length >= 1, or two rising, got"):
            TextDataModule(dataset="synthetic", max_length_caps=caps)
