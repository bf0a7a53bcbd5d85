"""Skip-gram word vectors of the training texts (training/word_vectors.py): subsampling, the window pairs on a
tiny known stream, that words sharing company end up close, and the bad inputs."""

import pytest
import torch
import torch.nn.functional as F
from conftest import QUIET, marker_rows, write_csv

import train
from model.config import ConfigError, NetworkConfig
from training.module import ClassifierModule
from training.word_vectors import keep_probability, skipgram_vectors, window_pairs


def test_keep_probability_thins_frequent_words_only():
    counts = torch.tensor([0, 0, 9_000, 10, 990])  # frequencies 0.9, 0.001, 0.099 of 10,000 words
    keep = keep_probability(counts, threshold=1e-3)
    assert keep[3] == 1.0  # at the threshold: always kept
    ratio = 1e-3 / 0.9
    assert keep[2].item() == pytest.approx(ratio**0.5 + ratio, rel=1e-5)  # word2vec's (√(f/t) + 1)·t/f
    assert keep[2] < keep[4] < 1.0


def test_window_pairs_of_a_known_stream_never_cross_texts():
    ids = torch.tensor([5, 6, 7, 8, 9])
    text = torch.tensor([0, 0, 0, 1, 1])  # "5 6 7" and "8 9"
    centers, contexts = window_pairs(ids, text, window=1)  # window 1: every center reaches exactly 1
    pairs = sorted(zip(centers.tolist(), contexts.tolist()))
    assert pairs == [(5, 6), (6, 5), (6, 7), (7, 6), (8, 9), (9, 8)]  # never (7, 8): they are in different texts
    centers, contexts = window_pairs(ids, text, window=2, generator=torch.Generator().manual_seed(0))
    pairs = set(zip(centers.tolist(), contexts.tolist()))
    assert pairs <= {(5, 6), (6, 5), (6, 7), (7, 6), (5, 7), (7, 5), (8, 9), (9, 8)}
    assert {(5, 6), (6, 5), (6, 7), (7, 6), (8, 9), (9, 8)} <= pairs  # neighbours at distance 1 always pair


def corpus(texts: int = 400, length: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Texts drawn from one of two disjoint word groups: 2-9 or 10-17 (ids 0, 1 are [PAD], [UNK])."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randint(2, 10, (length,), generator=g) + 8 * (i % 2) for i in range(texts)]
    offsets = torch.tensor([0] + [length] * texts).cumsum(0)
    return torch.cat(rows).int(), offsets


def test_words_in_the_same_company_end_up_close():
    ids, offsets = corpus()
    vectors = skipgram_vectors(ids, offsets, vocab_size=20, dim=16, epochs=5, window=3, subsample=1.0, lr=0.05,
                               chunk=256)
    unit = F.normalize(vectors[2:18], dim=-1)
    similarity = unit @ unit.T
    group = torch.arange(16) // 8
    same = similarity[(group[:, None] == group[None, :]) & ~torch.eye(16, dtype=torch.bool)].mean()
    other = similarity[group[:, None] != group[None, :]].mean()
    assert same > other + 0.5, (same, other)
    # Rows of words never seen ([PAD], [UNK], 18, 19) keep their tiny random start.
    assert vectors[[0, 1, 18, 19]].abs().max() <= 0.5 / 16


def test_the_same_seed_gives_the_same_vectors():
    ids, offsets = corpus(texts=40)
    first = skipgram_vectors(ids, offsets, vocab_size=20, dim=8, epochs=1, chunk=64, seed=3)
    assert torch.equal(first, skipgram_vectors(ids, offsets, vocab_size=20, dim=8, epochs=1, chunk=64, seed=3))
    assert not torch.equal(first, skipgram_vectors(ids, offsets, vocab_size=20, dim=8, epochs=1, chunk=64, seed=4))


def test_texts_without_known_words_are_refused():
    ids = torch.tensor([1, 1, 0, 1], dtype=torch.int32)  # [UNK] and [PAD] only
    with pytest.raises(ValueError, match="at least two known words"):
        skipgram_vectors(ids, torch.tensor([0, 2, 4]), vocab_size=10, dim=4)
    with pytest.raises(ValueError, match="epochs"):
        skipgram_vectors(*corpus(texts=4), vocab_size=20, dim=4, epochs=0)


def short_fit_args(tmp_path, train_file, *extra):
    return ["fit", "--data.train_file", str(train_file), "--data.cache_dir", str(tmp_path / "cache"),
            "--trainer.default_root_dir", str(tmp_path), "--trainer.callbacks", "[]",
            "--trainer.limit_train_batches", "2", "--trainer.limit_val_batches", "1", *QUIET, *extra]


@pytest.mark.slow
def test_a_fresh_fit_starts_from_the_word_vectors_and_a_resume_keeps_its_weights(tmp_path, monkeypatch):
    import training.word_vectors

    made = []

    def spy(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    real = training.word_vectors.skipgram_vectors
    monkeypatch.setattr(training.word_vectors, "skipgram_vectors", spy)
    train_file = write_csv(tmp_path / "texts.csv", marker_rows(300))
    args = short_fit_args(tmp_path, train_file, "--model.word_vectors", "2", "--model.lr", "1e-6")
    train.main([*args, "--trainer.max_epochs", "1"])
    assert len(made) == 1
    last = tmp_path / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    embedding = checkpoint["state_dict"]["model.token_embedding.weight"]
    std = checkpoint["hyper_parameters"]["network"]["embedding_std"]
    # Two steps at lr 1e-6 later, still the vectors, scaled to the spread the embedding starts with.
    assert torch.allclose(embedding, made[0] / made[0].std() * std, atol=1e-4)
    train.main([*args, "--trainer.max_epochs", "2", "--ckpt_path", "last"])
    assert len(made) == 1  # resuming reads the weights from the checkpoint: no new vectors
    assert torch.load(last, weights_only=True)["global_step"] == 4


def test_bad_word_vector_settings_get_one_line(tmp_path):
    train_file = write_csv(tmp_path / "texts.csv", marker_rows(50))
    with pytest.raises(SystemExit) as stop:
        train.main([*short_fit_args(tmp_path, train_file), "--model.word_vectors", "-1"])
    message = str(stop.value.code)
    assert "model.word_vectors must be 0 (off) or a number of epochs, got -1" in message and "\n" not in message
    with pytest.raises(ConfigError, match="model.word_vectors and model.init_from both set the starting embedding"):
        ClassifierModule(NetworkConfig(vocab_size=20, num_classes=2), word_vectors=2, init_from="pretrained.ckpt")
