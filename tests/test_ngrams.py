"""The n-gram branch (model/ngrams.py): each distinct n-gram of a text counted once, padding changes nothing, the
naive-Bayes start is NBSVM's log-count ratio, a checkpoint with the branch loads with weights_only and its ONNX
export computes the same rows."""

import math
import random

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
@pytest.mark.parametrize("fitted", [False, True])
def test_the_onnx_export_computes_the_same_ngram_votes(tmp_path, fitted):
    import numpy as np

    import export
    from test_export import TEXTS, TOLERANCE, run_onnx

    classifier = tiny_classifier(n_layers=1, ngrams=3, ngram_buckets=97, ngram_fitted=fitted)
    bag = classifier.model.ngram_bag
    if fitted:  # a regression's table, idf and bias
        with torch.no_grad():
            bag.table.normal_(std=3.0), bag.idf.uniform_(0.5, 3.0), bag.bias.normal_()
    else:
        torch.nn.init.normal_(bag.ngram_embedding.weight)  # the votes dominate the logits
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


def split_of(texts, labels) -> EncodedSplit:
    offsets = torch.tensor([0, *torch.tensor([len(t) for t in texts]).cumsum(0).tolist()])
    return EncodedSplit(torch.tensor([t for text in texts for t in text]), offsets, torch.as_tensor(labels))


def random_texts(n, vocab, seed):
    """Texts whose label is whether token 3 or the pair (4, 5) occurs: a regression on n-grams can learn it."""
    g = torch.Generator().manual_seed(seed)
    texts = [torch.randint(6, vocab, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g).tolist()
             for _ in range(n)]
    labels = []
    for i, text in enumerate(texts):
        if i % 3 == 0:
            text[0] = 3
        elif i % 3 == 1 and len(text) > 2:
            text[1:3] = [4, 5]
        labels.append(int(3 in text or any(text[j:j + 2] == [4, 5] for j in range(len(text) - 1))))
    return texts, labels


def fitted_network(vocab=40, buckets=64, classes=2):
    return AttentionClassifier(NetworkConfig(vocab_size=vocab, max_length=16, d_model=8, n_heads=2, ngrams=2,
                                             ngram_buckets=buckets, ngram_fitted=True, num_classes=classes)).eval()


def tfidf_reference(texts, vocab, buckets, fitted_on):
    """x of each text written the plainest way: idf_r = ln((1 + N) / (1 + df_r)) + 1 over `fitted_on`, binary tf,
    unit length."""
    import numpy as np

    df = {}
    for text in fitted_on:
        for row in distinct_rows(text, 2, vocab, buckets):
            df[row] = df.get(row, 0) + 1
    x = np.zeros((len(texts), vocab + buckets))
    for i, text in enumerate(texts):
        for row in distinct_rows(text, 2, vocab, buckets):
            x[i, row] = math.log((1 + len(fitted_on)) / (1 + df[row])) + 1 if row in df else 0.0
        x[i] /= max(np.linalg.norm(x[i]), 1e-12)
    return x


def test_the_fitted_bag_is_the_tfidf_regression_fitted_on_the_training_texts():
    """The bag's logits on new texts are sklearn's LogisticRegression (C = 4) fitted on the TF-IDF of the training
    texts' n-gram rows, each written here without the bag's code; its softmax is the regression's predict_proba."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from training.ngram_fit import fit_ngram_bag

    texts, labels = random_texts(60, 40, seed=0)
    network = fitted_network()
    fit_ngram_bag([network], split_of(texts, labels), multi_label=False, seed=0, balanced=False, fit_whole=True,
                  weighting="tfidf")
    new, _ = random_texts(7, 40, seed=1)
    new.append([39, 38])  # n-grams no training text has, perhaps
    model = LogisticRegression(C=4.0, max_iter=2000).fit(tfidf_reference(texts, 40, 64, texts), labels)
    expected = model.predict_proba(tfidf_reference(new, 40, 64, texts))
    ids = torch.tensor([t + [0] * (8 - len(t)) for t in new])
    got = network.ngram_bag(ids, padding_mask([len(t) for t in new], 8)).softmax(-1)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-4)


def nb_reference(texts, vocab, buckets, fitted_on, fitted_labels):
    """x of each text with NBSVM's weights written the plainest way: w_r = idf_r · ln(p_r / q_r) over `fitted_on`,
    p_r = (texts of class 1 with r + 1) / Σ over the rows those texts have, q_r the same for class 0; unit length."""
    import numpy as np

    rows_of = [distinct_rows(text, 2, vocab, buckets) for text in fitted_on]
    has = sorted(set().union(*rows_of))
    count = {c: {r: sum(r in rows and y == c for rows, y in zip(rows_of, fitted_labels)) + 1 for r in has}
             for c in (0, 1)}
    total = {c: sum(count[c].values()) for c in (0, 1)}
    ratio = {r: math.log((count[1][r] / total[1]) / (count[0][r] / total[0])) for r in has}
    x = np.zeros((len(texts), vocab + buckets))
    df = {r: sum(r in rows for rows in rows_of) for r in has}
    for i, text in enumerate(texts):
        for row in distinct_rows(text, 2, vocab, buckets):
            if row in has:
                x[i, row] = (math.log((1 + len(fitted_on)) / (1 + df[row])) + 1) * ratio[row]
        x[i] /= max(np.linalg.norm(x[i]), 1e-12)
    return x


def test_with_nb_weights_the_bag_is_the_regression_on_ngrams_weighed_by_nbsvm_ratios():
    """ngram_weighting nb (two classes): the bag is sklearn's LogisticRegression (C = 16) on the
    n-gram rows weighed by idf times naive Bayes' log-count ratio (NBSVM), each written here without the bag's code."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from training.ngram_fit import fit_ngram_bag

    texts, labels = random_texts(60, 40, seed=0)
    new, _ = random_texts(7, 40, seed=1)
    new.append([39, 38])
    model = LogisticRegression(C=16.0, max_iter=2000).fit(nb_reference(texts, 40, 64, texts, labels), labels)
    expected = model.predict_proba(nb_reference(new, 40, 64, texts, labels))
    ids = torch.tensor([t + [0] * (8 - len(t)) for t in new])
    network = fitted_network()
    fit_ngram_bag([network], split_of(texts, labels), False, 0, False, True, weighting="nb")
    got = network.ngram_bag(ids, padding_mask([len(t) for t in new], 8)).softmax(-1)
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-4)
    assert (network.ngram_bag.idf < 0).any() and (network.ngram_bag.idf > 0).any()  # rows for either class


def test_each_fold_weighs_ngrams_by_the_ratios_of_its_own_texts():
    """The log-count ratio reads labels, so a fold's ratio counts only the texts its regression is fitted on: a
    text's out-of-fold logits are those of a bag fitted with nb weights on the other folds alone."""
    import numpy as np

    from training.ngram_fit import feature_weights, fit_ngram_bag, folds_of

    texts, labels = random_texts(80, 40, seed=2)
    out_of_fold = fit_ngram_bag([fitted_network()], split_of(texts, labels), False, 0, False, True, weighting="nb")
    fitted, scored = folds_of(np.array(labels), False, 0)[0]
    alone = fitted_network()
    fit_ngram_bag([alone], split_of([texts[i] for i in fitted], [labels[i] for i in fitted]), False, 0, False, True,
                  weighting="nb")
    batch = split_of([texts[i] for i in scored], [labels[i] for i in scored])
    batch = batch.__getitems__(list(range(len(scored))))
    # idf counts every training text in the fit, the ratio only the fold's: compare the answers, not the numbers
    assert out_of_fold[scored].argmax(1).tolist() == alone.ngram_bag(batch["input_ids"],
                                                                   batch["padding_mask"]).argmax(1).tolist()
    # a row on texts of one class only: the fold's ratio is the fold's
    import scipy.sparse

    binary = scipy.sparse.csr_matrix(np.array([[1, 0], [1, 1], [0, 1]], dtype=np.float32))
    w = feature_weights(binary, np.array([1, 1, 0]), np.ones(2), "nb")
    assert w[0] == pytest.approx(math.log((3 / 5) / (1 / 3))) and w[1] == pytest.approx(math.log((2 / 5) / (2 / 3)))
    assert feature_weights(binary[:1], np.array([1]), np.ones(2), "nb")[1] == 0  # a row none of them has


def test_each_training_text_gets_the_logits_of_a_regression_that_never_saw_it():
    """Out of fold: no text's logits come from a regression fitted on it, so they are less sure of its label than
    the bag fitted on every text (which is near-certain on texts it was fitted on), and they are those of a
    regression fitted on the rest."""
    from training.ngram_fit import fit_ngram_bag

    texts, labels = random_texts(80, 40, seed=2)
    split = split_of(texts, labels)
    network = fitted_network()
    out_of_fold = fit_ngram_bag([network], split, multi_label=False, seed=0, balanced=False, fit_whole=True)
    batch = split.__getitems__(list(range(len(split))))
    whole = network.ngram_bag(batch["input_ids"], batch["padding_mask"])
    label = torch.tensor(labels)
    margin = lambda logits: (logits[range(len(label)), label] - logits[range(len(label)), 1 - label]).mean()  # noqa: E731
    assert margin(out_of_fold) < margin(whole) - 0.1
    # fold of text 0 recomputed: a bag fitted on the texts of the other folds gives text 0 the same logits
    from training.ngram_fit import folds_of

    fitted, scored = next((f, s) for f, s in folds_of(label.numpy(), False, 0) if 0 in s)
    alone = fitted_network()
    fit_ngram_bag([alone], split_of([texts[i] for i in fitted], [labels[i] for i in fitted]), False, 0, False, True)
    # the idf of a fold differs from the whole split's: the regression is fitted on the whole split's idf, so
    # compare the answers, not the numbers
    assert out_of_fold[scored].argmax(1).tolist() == alone.ngram_bag(
        *(lambda b: (b["input_ids"], b["padding_mask"]))(split.__getitems__(list(scored)))).argmax(1).tolist()


def test_the_fitted_bag_is_not_trained_and_training_batches_carry_its_out_of_fold_logits(tmp_path):
    network = fitted_network()
    assert not any("ngram_bag" in name for name, _ in network.named_parameters())
    assert {"ngram_bag.table", "ngram_bag.idf", "ngram_bag.bias"} <= set(network.state_dict())
    texts, labels = random_texts(30, 40, seed=3)
    split = split_of(texts, labels)
    split.ngram_logits = torch.randn(len(split), 2)
    batch = split.__getitems__([4, 2, 7])
    torch.testing.assert_close(batch["ngram_logits"], split.ngram_logits[[4, 2, 7]])
    from data.batches import collate

    torch.testing.assert_close(collate([split[i] for i in (4, 2, 7)])["ngram_logits"], batch["ngram_logits"])
    # given logits replace the bag's: the attention path's logits plus them
    given = torch.randn(3, 2)
    attention_only = network(batch["input_ids"], batch["padding_mask"], ngram_logits=torch.zeros(3, 2)).logits
    torch.testing.assert_close(network(batch["input_ids"], batch["padding_mask"], ngram_logits=given).logits,
                               attention_only + given)


@pytest.mark.parametrize("classes", [3, 5])
def test_a_class_no_fold_saw_is_never_the_fitted_bags_answer(classes):
    """Several classes, one of them with a single text (some folds never see it) or none (class 4 of 5)."""
    from training.ngram_fit import fit_ngram_bag

    texts, labels = random_texts(40, 40, seed=4)
    labels = [2 if i == 0 else label for i, label in enumerate(labels)]
    network = fitted_network(classes=classes)
    out_of_fold = fit_ngram_bag([network], split_of(texts, labels), False, 0, False, True)
    assert torch.isfinite(out_of_fold).all()
    batch = split_of(texts, labels).__getitems__(list(range(len(texts))))
    answers = network.ngram_bag(batch["input_ids"], batch["padding_mask"]).argmax(1)
    if classes == 5:
        assert (answers != 4).all() and (out_of_fold.argmax(1) != 4).all()


def test_several_labels_get_one_regression_each_and_a_constant_label_its_constant():
    from training.ngram_fit import fit_ngram_bag

    texts, labels = random_texts(40, 40, seed=5)
    multi_hot = torch.tensor([[label, 1 - label, 1.0] for label in labels])  # label 2 on every text
    network = fitted_network(classes=3)
    out_of_fold = fit_ngram_bag([network], split_of(texts, multi_hot), True, 0, False, True)
    assert (out_of_fold[:, 2] > 5).all()
    batch = split_of(texts, multi_hot).__getitems__(list(range(len(texts))))
    logits = network.ngram_bag(batch["input_ids"], batch["padding_mask"])
    assert ((logits[:, 0] > 0).float() == multi_hot[:, 0]).float().mean() > 0.9
    assert (logits[:, 2] > 5).all()


def test_ngram_fitted_without_a_bag_is_a_config_error():
    with pytest.raises(ConfigError, match="ngram_fitted needs an n-gram bag"):
        NetworkConfig(ngram_fitted=True)


def test_a_weighting_the_bag_cannot_have_is_a_config_error():
    with pytest.raises(ConfigError, match="ngram_weighting must be one of tfidf, nb, got 'bm25'"):
        NetworkConfig(ngrams=2, ngram_fitted=True, ngram_weighting="bm25")
    with pytest.raises(ConfigError, match="ngram_weighting nb .* needs num_classes 2, got 3"):
        NetworkConfig(ngrams=2, ngram_fitted=True, ngram_weighting="nb", num_classes=3)
    assert NetworkConfig(ngrams=2, ngram_fitted=True, num_classes=3).ngram_weighting == "tfidf"


def test_nb_weights_are_refused_for_several_labels_a_text_where_the_fit_meets_them():
    from training.ngram_fit import bag_weighting

    assert [bag_weighting("tfidf", 3, True), bag_weighting("nb", 2, False)] == ["tfidf", "nb"]
    with pytest.raises(ValueError, match="two classes and one label"):
        bag_weighting("nb", 2, True)
    with pytest.raises(ValueError, match="two classes and one label"):
        bag_weighting("nb", 3, False)


@pytest.mark.slow  # a short fit, then resumed
def test_a_fit_with_the_fitted_bag_saves_it_and_predict_reads_its_checkpoint(tmp_path, capsys):
    import json

    import predict
    from conftest import fit, rows, write

    train_file = write(tmp_path / "reviews.csv", rows(8))
    root = tmp_path / "fitted"
    fit(root, "--data.train_file", str(train_file), "--data.vocab_size", "64", "--trainer.max_epochs", "1",
        "--model.network.ngrams", "2", "--model.network.ngram_fitted", "true")
    (ckpt,) = root.glob("lightning_logs/version_0/checkpoints/last.ckpt")
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    assert state["model.ngram_bag.idf"].max() > 1 and state["model.ngram_bag.table"].abs().max() > 0.1
    assert predict.main(["--ckpt", str(ckpt), "a great film", "a dull mess"]) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [p["label"] for p in printed] == ["pos", "neg"]
    # resumed for one more epoch: the bag keeps the table it was fitted with
    fit(root, "--data.train_file", str(train_file), "--data.vocab_size", "64", "--trainer.max_epochs", "2",
        "--model.network.ngrams", "2", "--model.network.ngram_fitted", "true", "--ckpt_path", str(ckpt))
    again = max(root.glob("lightning_logs/*/checkpoints/last.ckpt"), key=lambda path: path.stat().st_mtime)
    assert torch.load(again, weights_only=True)["epoch"] == 1
    torch.testing.assert_close(torch.load(again, weights_only=True)["state_dict"]["model.ngram_bag.table"],
                               state["model.ngram_bag.table"])


def test_a_naive_bayes_start_of_a_fitted_bag_is_a_config_error():
    from training.module import ClassifierModule

    with pytest.raises(ConfigError, match="give one"):
        ClassifierModule(network=NetworkConfig(ngrams=2, ngram_fitted=True), ngram_start=0.2)


def test_the_bags_fit_is_cached_by_the_texts_it_was_fitted_on(tmp_path, monkeypatch):
    import training.ngram_fit as ngram_fit

    texts, labels = random_texts(40, 40, seed=6)
    first, second = fitted_network(), fitted_network()
    logits = ngram_fit.fit_ngram_bag([first], split_of(texts, labels), False, 0, False, True, cache_dir=tmp_path)

    def refit(*args):
        raise AssertionError("fitted again")

    monkeypatch.setattr(ngram_fit, "regressions", refit)
    again = ngram_fit.fit_ngram_bag([second], split_of(texts, labels), False, 0, False, True, cache_dir=tmp_path)
    torch.testing.assert_close(again, logits)
    for name, buffer in first.ngram_bag.named_buffers():
        torch.testing.assert_close(getattr(second.ngram_bag, name), buffer)
    labels[0] = 1 - labels[0]  # another label: another entry
    with pytest.raises(AssertionError, match="fitted again"):
        ngram_fit.fit_ngram_bag([second], split_of(texts, labels), False, 0, False, True, cache_dir=tmp_path)


def test_the_parts_bench_scores_the_bag_alone_and_the_rest(tmp_path):
    """bench/bag_parts.py: with the head silenced the whole model is its bag; the rest then answers class 0 always."""
    from bench.bag_parts import parts_accuracy
    from conftest import WORDS

    classifier = tiny_classifier(ngrams=2, ngram_buckets=32, ngram_fitted=True)
    network = classifier.model
    with torch.no_grad():
        network.ngram_bag.table.normal_(std=2.0), network.ngram_bag.idf.fill_(1.0)
        network.head.weight.zero_(), network.head.bias.zero_()
    ckpt = save_checkpoint(classifier, tmp_path / "bag.ckpt")
    texts = [" ".join(WORDS[i : i + 4]) for i in range(12)]
    ids, _, _ = classifier.encode(texts)
    bag_answers = [int(network.ngram_bag(torch.tensor([row]), torch.zeros(1, len(row), dtype=torch.bool)).argmax())
                   for row in ids]
    labels = ["neg", "pos"] * 6
    scores = parts_accuracy(ckpt, texts, labels)
    expected = 100 * sum(a == ["neg", "pos"].index(label) for a, label in zip(bag_answers, labels)) / len(labels)
    assert scores["whole"] == scores["bag alone"] == pytest.approx(expected)
    assert scores["attention alone"] == pytest.approx(50.0)  # logits all 0: argmax says class 0, half the labels


def test_past_the_sample_each_other_text_is_scored_by_a_fold_and_the_bag_fits_the_sample(monkeypatch):
    """The teacher's size rule: at most SAMPLE texts fitted on, the rest each scored by one fold's regression."""
    import training.ngram_fit as ngram_fit

    texts, labels = random_texts(90, 40, seed=7)
    monkeypatch.setattr(ngram_fit, "SAMPLE", 50)
    network = fitted_network()
    out_of_fold = ngram_fit.fit_ngram_bag([network], split_of(texts, labels), False, 0, False, True, weighting="tfidf")
    assert out_of_fold.shape == (90, 2) and torch.isfinite(out_of_fold).all()
    assert (out_of_fold != 0).any(dim=1).all()  # every text scored, in the sample or not
    agreement = (out_of_fold.argmax(1) == torch.tensor(labels)).float().mean()
    assert agreement > 0.7
    # the bag is the regression of the 50 sampled texts: idf counts 50 texts (the largest idf is ln(51/2) + 1)
    assert network.ngram_bag.idf.max() == pytest.approx(math.log(51 / 2) + 1, rel=1e-5)


def bag_checkpoint(path, network, **extra):
    torch.save({"state_dict": {f"model.{k}": v for k, v in network.state_dict().items()}, "hyper_parameters": {},
                **extra}, path)
    return path


def test_the_refit_bench_fits_the_bag_on_training_and_validation_texts_together(tmp_path):
    """bench/bag_refit.py (a candidate not shipped): the copy's bag becomes sklearn's regression on the TF-IDF of both
    splits' texts (written without the bag's code), every other weight as it was, and the copy says so."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from bench.bag_refit import REFIT_KEY, refit_checkpoint
    from training.ngram_fit import fit_ngram_bag

    texts, labels = random_texts(60, 40, seed=3)
    held, held_labels = random_texts(20, 40, seed=4)
    network = fitted_network()
    fit_ngram_bag([network], split_of(texts, labels), multi_label=False, seed=0, balanced=False, fit_whole=True)
    path = bag_checkpoint(tmp_path / "best.ckpt", network, epoch=3)
    before, written = torch.load(path, weights_only=True), path.read_bytes()
    assert refit_checkpoint(path, tmp_path / "refit" / "refit.ckpt", {"train": split_of(texts, labels), "validation": split_of(held, held_labels)},
                            network.ngram_bag, multi_label=False, balanced=False) == 80
    assert path.read_bytes() == written  # the run's own checkpoint is left as it was
    after = torch.load(tmp_path / "refit" / "refit.ckpt", weights_only=True)
    assert after[REFIT_KEY] == {"texts": 80, "splits": ["train", "validation"]} and after["epoch"] == 3
    for key, value in before["state_dict"].items():
        if "ngram_bag" not in key:
            torch.testing.assert_close(after["state_dict"][key], value)
    refit = fitted_network()
    refit.load_state_dict({k.removeprefix("model."): v for k, v in after["state_dict"].items()})
    every = texts + held
    model = LogisticRegression(C=4.0, max_iter=2000).fit(tfidf_reference(every, 40, 64, every), labels + held_labels)
    new, _ = random_texts(7, 40, seed=5)
    ids = torch.tensor([t + [0] * (8 - len(t)) for t in new])
    got = refit.ngram_bag(ids, padding_mask([len(t) for t in new], 8)).softmax(-1)
    np.testing.assert_allclose(got.detach().numpy(), model.predict_proba(tfidf_reference(new, 40, 64, every)),
                               atol=1e-4)



def test_the_weighting_bench_fits_both_bags_on_the_data_a_run_would_read(tmp_path):
    """bench/bag_weights.py: each weighting's bag, fitted on the training file as a run reads it (its own validation
    tenth held out), is right on held-out texts whose one word of sentiment decides the label."""
    from bench.bag_weights import WEIGHTINGS, measure

    good, bad = ["fine", "great", "superb", "lovely"], ["awful", "dull", "poor", "bland"]
    filler = ["the", "a", "film", "plot", "actor", "story", "scene", "music"]
    rng = random.Random(0)

    def rows(n):
        out = []
        for i in range(n):
            label = i % 2
            words = rng.sample(filler, 4) + [rng.choice(good if label else bad)]
            rng.shuffle(words)
            out.append((" ".join(words), label))
        return out

    (tmp_path / "train.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows(200)))
    (tmp_path / "test.csv").write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows(40)))
    row = measure("sst2", buckets=257, train_file=str(tmp_path / "train.csv"), test_file=str(tmp_path / "test.csv"),
                  cache_dir=tmp_path / "cache")
    assert row["texts"] == {"train": 180, "validation": 20, "test": 40}
    for weighting in WEIGHTINGS:
        assert row[weighting]["test"] == 100.0 and row[weighting]["validation"] == 100.0
        assert row[weighting]["out of fold"] > 95
