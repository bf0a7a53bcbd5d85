"""The n-gram branch (model/ngrams.py): each distinct n-gram of a text counted once, padding changes nothing, the
naive-Bayes start is NBSVM's log-count ratio, a checkpoint with the branch loads with weights_only and its ONNX
export computes the same rows."""

import math

import pytest
import torch

from conftest import padding_mask, save_checkpoint, tiny_classifier
from data.encoded import EncodedSplit
from model.classifier import AttentionClassifier
from model.config import ConfigError, NetworkConfig
from model.ngrams import NgramBag, nb_log_count_ratios, ngram_ids
from training.ngram_start import ngram_counts, start_from_naive_bayes


def distinct_rows(ids, order, vocab_size, buckets):
    """Reference: the set of rows of one text's n-grams, written the plainest way."""
    rows = set()
    for n in range(1, order + 1):
        for i in range(len(ids) - n + 1):
            gram = ids[i : i + n]
            if n == 1:
                rows.add(gram[0])
            else:
                h = gram[0] % buckets
                for t in gram[1:]:
                    h = (h * 1_000_003 + t) % buckets
                rows.add(vocab_size + h)
    return rows


@pytest.mark.parametrize("order", [1, 2, 3])
def test_each_distinct_ngram_of_a_text_is_counted_once(order):
    texts = [[5, 6, 5, 6, 5], [7, 7, 7], [3], [2, 9, 4, 2, 9]]
    L = 7
    ids = torch.tensor([t + [0] * (L - len(t)) for t in texts])
    rows, present = ngram_ids(ids, padding_mask([len(t) for t in texts], L), order, vocab_size=10, buckets=50)
    for row, text in enumerate(texts):
        found = rows[row][present[row]].tolist()
        assert len(found) == len(set(found))  # no repeat
        assert set(found) == distinct_rows(text, order, 10, 50)


def test_padding_and_neighbours_change_no_ngram_logits():
    torch.manual_seed(0)
    bag = NgramBag(order=3, vocab_size=20, buckets=64, num_classes=3)
    torch.nn.init.normal_(bag.ngram_embedding.weight)
    ids = torch.randint(1, 20, (4, 6))
    lengths = [6, 4, 1, 3]
    short = bag(ids, padding_mask(lengths, 6))
    padded = bag(torch.cat([ids, torch.randint(1, 20, (4, 5))], 1), padding_mask(lengths, 11))
    torch.testing.assert_close(short, padded)
    torch.testing.assert_close(bag(ids[1:2], padding_mask(lengths[1:2], 6)), short[1:2])


def test_the_logits_of_a_network_with_the_branch_are_the_attention_heads_plus_the_ngram_votes():
    config = NetworkConfig(vocab_size=30, max_length=8, d_model=8, n_heads=2, ngrams=2, ngram_buckets=16, dropout=0.0,
                           embedding_dropout=0.0)
    torch.manual_seed(0)
    network = AttentionClassifier(config).eval()
    torch.nn.init.normal_(network.ngram_bag.ngram_embedding.weight)
    ids, mask = torch.randint(1, 30, (3, 8)), padding_mask([8, 5, 2], 8)
    with_branch = network(ids, mask).logits
    votes = network.ngram_bag(ids, mask)
    network.ngram_bag = None
    torch.testing.assert_close(with_branch, network(ids, mask).logits + votes)
    assert votes.abs().sum() > 0


def test_naive_bayes_weights_for_two_classes_differ_by_nbsvms_log_count_ratio():
    # features 0..2 in 4 texts: counts per class (negative, positive)
    counts = torch.tensor([[3.0, 0.0], [1.0, 2.0], [0.0, 0.0]])
    weights = nb_log_count_ratios(counts, counts.sum(1), multi_label=False)
    p = torch.tensor([0.0, 2.0]) + 1  # positive counts of the seen features, add-one
    q = torch.tensor([3.0, 1.0]) + 1
    r = torch.log((p / p.sum()) / (q / q.sum()))
    torch.testing.assert_close(weights[:2, 1] - weights[:2, 0], r.float())
    assert weights[2].abs().sum() == 0  # never seen: says nothing


def test_naive_bayes_counts_of_a_split_are_its_texts_ngrams():
    texts = [[4, 5, 4], [5, 6], [4, 5]]
    labels = torch.tensor([1, 0, 1])
    split = EncodedSplit(torch.tensor([t for text in texts for t in text]),
                         torch.tensor([0, 3, 5, 7]), labels)
    bag = NgramBag(order=2, vocab_size=8, buckets=32, num_classes=2)
    counts, texts_with = ngram_counts(split, bag, 2)
    expected = torch.zeros(40, 2, dtype=torch.float64)
    for text, label in zip(texts, labels.tolist()):
        for row in distinct_rows(text, 2, 8, 32):
            expected[row, label] += 1
    torch.testing.assert_close(counts, expected)
    torch.testing.assert_close(texts_with, expected.sum(1))
    network = AttentionClassifier(NetworkConfig(vocab_size=8, max_length=4, d_model=8, n_heads=2, ngrams=2,
                                                ngram_buckets=32))
    start_from_naive_bayes([network], split, 0.5, multi_label=False)
    table = network.ngram_bag.ngram_embedding.weight
    assert table[4, 1] > table[4, 0] and table[6, 0] > table[6, 1]  # 4 only in positives, 6 only in a negative
    assert table[7].abs().sum() == 0


def test_multi_label_naive_bayes_weights_are_each_labels_log_ratio():
    # feature 0 in 2 texts that both have label 0, feature 1 in 2 texts that both have label 1
    counts = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    weights = nb_log_count_ratios(counts, torch.tensor([2.0, 2.0]), multi_label=True)
    # label 0: its positives hold feature 0 twice, p = (3/4, 1/4); its negatives feature 1 twice, q = (1/4, 3/4)
    expected = math.log(3)
    torch.testing.assert_close(weights, torch.tensor([[expected, -expected], [-expected, expected]]))


def test_bad_ngram_settings_are_config_errors():
    with pytest.raises(ConfigError, match="ngrams"):
        NetworkConfig(ngrams=-1)
    with pytest.raises(ConfigError, match="ngram_buckets"):
        NetworkConfig(ngrams=2, ngram_buckets=0)


def test_a_checkpoint_with_the_branch_loads_with_weights_only(tmp_path):
    classifier = tiny_classifier(ngrams=2, ngram_buckets=32)
    torch.nn.init.normal_(classifier.model.ngram_bag.ngram_embedding.weight)
    path = save_checkpoint(classifier, tmp_path / "ngrams.ckpt")
    checkpoint = torch.load(path, weights_only=True)
    config = NetworkConfig.from_dict(checkpoint["hyper_parameters"]["network"])
    network = AttentionClassifier(config)
    network.load_state_dict({k.removeprefix("model."): v for k, v in checkpoint["state_dict"].items()})
    ids, mask = torch.randint(1, 64, (2, 12)), padding_mask([12, 3], 12)
    torch.testing.assert_close(network.eval()(ids, mask).logits, classifier.model.eval()(ids, mask).logits)


@pytest.mark.slow  # torch.export and ONNX conversion
def test_the_onnx_export_computes_the_same_ngram_votes(tmp_path):
    import numpy as np

    import export
    from test_export import TEXTS, TOLERANCE, run_onnx

    classifier = tiny_classifier(n_layers=1, ngrams=3, ngram_buckets=97)
    torch.nn.init.normal_(classifier.model.ngram_bag.ngram_embedding.weight)  # the votes dominate the logits
    ckpt = save_checkpoint(classifier, tmp_path / "ngrams.ckpt")
    assert export.main(["--ckpt", str(ckpt), "--out", str(tmp_path / "out")]) == 0
    for texts in (TEXTS, TEXTS[:1], ["w1 w1 w1 w2 w1 w2"]):  # another batch size, length and repeats
        _, _, _, outputs = run_onnx(tmp_path / "out", texts)
        expected = np.array([[p.probabilities[name] for name in classifier.label_names]
                             for p in classifier.predict(texts)])
        probabilities = torch.from_numpy(outputs["logits"]).softmax(-1).numpy()
        np.testing.assert_allclose(probabilities, expected, atol=TOLERANCE)


@pytest.mark.slow  # two short fits
def test_a_fit_starts_the_branch_from_naive_bayes_and_predict_reads_its_checkpoint(tmp_path, capsys):
    import json

    import predict
    from conftest import fit, rows, write

    train_file = write(tmp_path / "reviews.csv", rows(8))
    tables = {}
    for start in (0.0, 1.0):
        root = tmp_path / f"start{start}"
        # a learning rate so small that the table the fit saves is the one it started from
        fit(root, "--data.train_file", str(train_file), "--data.vocab_size", "64", "--trainer.max_epochs", "1",
            "--model.network.ngrams", "2", "--model.ngram_start", str(start), "--model.lr", "1e-12")
        (ckpt,) = root.glob("lightning_logs/version_0/checkpoints/last.ckpt")
        checkpoint = torch.load(ckpt, weights_only=True)
        tables[start] = checkpoint["state_dict"]["model.ngram_bag.ngram_embedding.weight"]
        labels = checkpoint["hyper_parameters"]["label_names"]
    assert tables[0.0].abs().max() < 1e-6
    pos, neg = labels.index("pos"), labels.index("neg")
    votes = (tables[1.0][:, pos] - tables[1.0][:, neg]).abs()
    assert votes.max() > 0.5  # words of one class only
    assert predict.main(["--ckpt", str(ckpt), "--attention", "a great film", "a dull mess"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["label"] for p in printed] == ["pos", "neg"]  # the naive-Bayes votes alone: nothing else learned
    assert all(p["attention"] for p in printed)
