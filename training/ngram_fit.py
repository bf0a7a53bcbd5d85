"""The fitted n-gram bag (network.ngram_fitted): the TF-IDF + LR recipe on the network's own n-gram rows
(model/ngrams.py), fitted on the training split before the first step, and the out-of-fold logits that let the
attention path learn what the bag gets wrong (stacking, Wolpert 1992).

    x_r = w_r / ||w over the text's distinct rows||            binary tf, unit length (TfidfVectorizer's rows)
    w_r = idf_r = ln((1 + N) / (1 + df_r)) + 1                  "tfidf"; 0 for a row no training text has
    w_r = idf_r · r_r, r_r = ln(p_r / q_r)                      "nb" (two classes): NBSVM's log-count ratio, p_r and
                                                                q_r the add-one shares of class 1's and class 0's
                                                                texts with the row (Wang & Manning 2012)
    logits = W x + b                                            logistic regression, C = 4 (tfidf) or 16 (nb)

"tfidf" is the default (network.ngram_weighting). With "nb" the bag alone gains 1.0, 1.0 and 0.3 points on the
validation splits of SST-2, IMDB and ChnSentiCorp (`python -m bench.bag_weights`), but the whole model gains on
IMDB only (docs/RESULTS.md "Naive-Bayes weights").

The training texts are cut into folds; each text's logits come from a regression fitted on the other folds (its
r too: the ratio reads labels), and the training step adds those to the attention path's logits instead of the
bag's own (model/classifier.py ngram_logits). A bag fitted on a text is near-certain and right on it, so the
attention path would learn nothing from the texts it is trained on; out of fold the bag is as unsure as it is on
unseen text, and the attention path learns to correct it there. Validation, test and prediction read the bag fitted
on every training text, as the checkpoint holds it (buffers, not parameters: the optimizer never moves them; the
buffer `idf` holds w).
"""

import hashlib
import logging
import time

import numpy as np
import torch

from data.progress import progress_bar
from model.ngrams import NgramBag
from training.ngram_teacher import SAMPLE

log = logging.getLogger(__name__)
FOLDS = 5
C = {"tfidf": 4.0, "nb": 16.0}  # tfidf: the n-gram teacher's (training/ngram_teacher.py); nb: chosen on validation
BATCH = 512  # texts turned into n-gram rows at a time
FIT_VERSION = 3  # part of the cache key: bump it when the fit's answers for the same texts change
UNSEEN_CLASS = 10.0  # a class a fold's regression never saw: this far under the text's lowest logit


def binary_rows(split, bag: NgramBag, texts: np.ndarray):
    """(len(texts), F) scipy CSR of 1s: the distinct n-gram rows of these texts (positions) of an EncodedSplit, as
    the bag reads them."""
    import scipy.sparse

    indptr, indices = [0], []
    for at in range(0, len(texts), BATCH):
        batch = split.__getitems__(texts[at : at + BATCH].tolist())
        rows, present = bag.ids(batch["input_ids"], batch["padding_mask"])  # (B, M) each
        for text_rows, text_present in zip(rows, present, strict=True):
            found = text_rows[text_present].numpy()
            indices.append(found)
            indptr.append(indptr[-1] + len(found))
    indices = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    return scipy.sparse.csr_matrix((np.ones(len(indices), dtype=np.float32), indices, np.asarray(indptr)),
                                   shape=(len(texts), bag.rows))


def seen_rows(binary) -> tuple[np.ndarray, np.ndarray, object]:
    """(seen (S,), idf (S,), binary (N, S)) of the texts of `binary`: the rows some text has (SST-2: 83k of 1.06M; the
    others' weights would be 0 all the same), their idf over these texts, and the texts' rows among them."""
    df = np.bincount(binary.indices, minlength=binary.shape[1])
    seen = np.flatnonzero(df > 0)
    idf = np.log((1 + binary.shape[0]) / (1 + df[seen])) + 1
    return seen, idf, binary[:, seen].tocsr()


def feature_weights(binary, y: np.ndarray, idf: np.ndarray, weighting: str) -> np.ndarray:
    """w (S,) of the rows of `binary` (N, S), whose texts have the labels y (N,): idf, or ("nb") idf times the
    log-count ratio r of class 1 to class 0 over these texts, add-one smoothed over the rows they have; a row none
    of them has gets 0 (it says nothing)."""
    if weighting == "tfidf":
        return idf
    with_row = lambda texts: np.asarray(binary[texts].sum(0)).ravel()  # noqa: E731  texts of a class with each row
    ones, zeros = with_row(y == 1), with_row(y == 0)
    present = (ones + zeros) > 0
    p, q = ones[present] + 1, zeros[present] + 1
    r = np.zeros(len(ones))
    r[present] = np.log((p / p.sum()) / (q / q.sum()))
    return idf * r


def bag_weighting(weighting: str, num_classes: int, multi_label: bool) -> str:
    """network.ngram_weighting, checked against the labels: "nb" needs two classes and one label a text."""
    if weighting not in C:
        raise ValueError(f"ngram_weighting must be one of {', '.join(C)}, got {weighting!r}")
    if weighting == "nb" and (num_classes != 2 or multi_label):
        raise ValueError("ngram_weighting nb needs two classes and one label a text")
    return weighting


def tfidf(binary, idf: np.ndarray):
    """Rows of `binary` weighed by `idf` (or any weights w) and scaled to unit length (a text with no row seen
    stays 0)."""
    import scipy.sparse

    x = binary @ scipy.sparse.diags(idf.astype(np.float32))
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    return scipy.sparse.diags(1 / np.maximum(norms, 1e-12).astype(np.float32)) @ x


def regression(multi_label: bool, balanced: bool, c: float):
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    if multi_label:  # one yes/no fit per label, as the teacher's (training/ngram_teacher.py)
        return OneVsRestClassifier(LogisticRegression(C=c, solver="liblinear"))
    return LogisticRegression(C=c, max_iter=2000, class_weight="balanced" if balanced else None)


def as_logits(model, x, num_classes: int) -> np.ndarray:
    """(N, num_classes) logits of a fitted one-label regression, whose softmax is its predict_proba. Two classes:
    ±d/2 of its one decision value; a class it never saw: UNSEEN_CLASS under the lowest."""
    decision, classes = model.decision_function(x), model.classes_
    if len(classes) == 2:
        decision = np.stack([-decision / 2, decision / 2], axis=1)
    logits = np.full((x.shape[0], num_classes), np.nan)
    logits[:, classes] = decision
    return np.where(np.isnan(logits), decision.min(1, keepdims=True) - UNSEEN_CLASS, logits)


def constant_labels(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Several labels a text, y (N, C) 0/1: (logits (C,) of the labels with nothing to learn, ±UNSEEN_CLASS for a label
    on every text or on none, 0 elsewhere; the positions of the others, each fitted by a regression)."""
    counts = y.sum(0)
    constant = np.where(counts == len(y), UNSEEN_CLASS, np.where(counts == 0, -UNSEEN_CLASS, 0.0))
    return constant, np.flatnonzero((counts > 0) & (counts < len(y)))


def fit_table(x, y, rows: int, num_classes: int, multi_label: bool, balanced: bool,
              c: float) -> tuple[np.ndarray, np.ndarray]:
    """(table (F, C), bias (C,)): the regression fitted on every training text in the bag's form, logits =
    table[rows]·x + bias. A class no text has (or, several labels, a label on every text or on none): its constant
    answer in the bias, UNSEEN_CLASS from the others."""
    table, bias = np.zeros((rows, num_classes)), np.zeros(num_classes)
    if multi_label:
        bias[:], varied = constant_labels(y)
        if len(varied):
            estimators = regression(True, False, c).fit(x, y[:, varied]).estimators_
            table[:, varied] = np.concatenate([e.coef_ for e in estimators]).T
            bias[varied] = np.concatenate([e.intercept_ for e in estimators])
        return table, bias
    classes = np.unique(y)
    bias[:] = -UNSEEN_CLASS
    if len(classes) == 1:
        bias[classes[0]] = 0.0
        return table, bias
    model = regression(False, balanced, c).fit(x, y)
    coef, intercept = model.coef_, model.intercept_
    if len(classes) == 2:
        coef, intercept = np.concatenate([-coef / 2, coef / 2]), np.concatenate([-intercept / 2, intercept / 2])
    table[:, classes], bias[classes] = coef.T, intercept
    return table, bias


def folds_of(labels: np.ndarray, multi_label: bool, seed: int):
    """(fitted, scored) positions of each fold: stratified for one label a text (fewer folds when a class is rarer
    than the folds), plain for several."""
    from sklearn.model_selection import KFold, StratifiedKFold

    n = len(labels)
    if multi_label or n < 2 * FOLDS:
        return list(KFold(min(FOLDS, n), shuffle=True, random_state=seed).split(np.zeros(n)))
    rarest = np.bincount(labels)[np.unique(labels)].min()
    return list(StratifiedKFold(max(2, min(FOLDS, int(rarest))), shuffle=True, random_state=seed)
                .split(np.zeros(n), labels))


def fit_ngram_bag(networks, split, multi_label: bool, seed: int, balanced: bool, fit_whole: bool,
                  cache_dir=None, weighting: str = "tfidf") -> torch.Tensor:
    """The out-of-fold logits (N, C) float32 of the training split (an EncodedSplit) and, with fit_whole (a fresh
    fit), each network's bag set to the regression fitted on every training text (past SAMPLE texts, a seeded
    sample: regressions()), its features weighed as `weighting` says (network.ngram_weighting). Returns the
    logits. With a cache_dir, the fit is an entry of its own there (data/cache.py), keyed by the split's token ids and labels and
    the settings: a second run on the same data reads it."""
    bag = networks[0].ngram_bag
    weighting = bag_weighting(weighting, bag.bias.shape[0], multi_label)
    settings = {"order": bag.order, "vocab_size": bag.vocab_size, "buckets": bag.buckets, "seed": seed,
                "balanced": balanced, "multi_label": multi_label, "folds": FOLDS, "C": C[weighting], "sample": SAMPLE,
                "weighting": weighting, "version": FIT_VERSION}
    build = lambda: regressions(split, bag, multi_label, seed, balanced, weighting)  # noqa: E731
    if cache_dir is None:
        fitted = build()
    else:
        from data.cache import entry_path, load_or_build

        key = settings | {"texts": content_hash(split)}
        fitted = load_or_build(entry_path(cache_dir, "ngram-bag", key), build, "n-gram bag")
    if fit_whole:
        with torch.no_grad():
            for network in networks:
                network.ngram_bag.table.zero_()
                network.ngram_bag.idf.zero_()
                network.ngram_bag.table[fitted["seen"]] = fitted["table"]
                network.ngram_bag.idf[fitted["seen"]] = fitted["idf"]
                network.ngram_bag.bias.copy_(fitted["bias"])
    return fitted["out_of_fold"]


def content_hash(split) -> str:
    """sha256 of a split's token ids, text boundaries and labels."""
    digest = hashlib.sha256()
    for tensor in (split.ids, split.offsets, split.labels):
        digest.update(np.ascontiguousarray(tensor.numpy()).tobytes())
    return digest.hexdigest()


def regressions(split, bag: NgramBag, multi_label: bool, seed: int, balanced: bool, weighting: str) -> dict:
    """{"out_of_fold" (N, C), "seen" (S,) the rows some fitted text has, and the regression fitted on every fitted
    text: "table" (S, C), "idf" (S,) its feature weights w, "bias" (C,)}, float32 tensors (seen int64). The size rule is the teacher's
    (training/ngram_teacher.py fitted_sample): at most SAMPLE texts (a seeded sample) are fitted on, in folds; each
    other text is scored by one fold's regression, BATCH texts at a time, so memory stays bounded."""
    start = time.perf_counter()
    num_classes, n = bag.bias.shape[0], len(split)
    chosen = np.arange(n) if n <= SAMPLE else np.sort(np.random.default_rng(seed).choice(n, SAMPLE, replace=False))
    rest = np.setdiff1d(np.arange(n), chosen, assume_unique=True)
    seen, idf, binary = seen_rows(binary_rows(split, bag, chosen))
    y_all = split.labels.numpy().astype(np.int64)
    y = y_all[chosen]
    out_of_fold = np.zeros((n, num_classes), dtype=np.float32)
    folds = folds_of(y, multi_label, seed)
    unseen = np.array_split(rest, len(folds))  # the texts outside the sample, a share for each fold's regression
    c, x_idf = C[weighting], tfidf(binary, idf) if weighting == "tfidf" else None  # the same rows for every fold
    with progress_bar(len(folds) + 1, "n-gram bag", unit="fit") as progress:
        for (fitted, scored), others in zip(folds, unseen, strict=True):
            w = feature_weights(binary[fitted], y[fitted], idf, weighting)  # the fold's own ratio r (it reads labels)
            x = x_idf if x_idf is not None else tfidf(binary, w)
            score = fit(x[fitted], y[fitted], num_classes, multi_label, balanced, c)
            out_of_fold[chosen[scored]] = score(x[scored])
            for at in range(0, len(others), BATCH):
                texts = others[at : at + BATCH]
                out_of_fold[texts] = score(tfidf(binary_rows(split, bag, texts)[:, seen], w))
            progress.update(1)
        w = feature_weights(binary, y, idf, weighting)
        x = x_idf if x_idf is not None else tfidf(binary, w)
        table, bias = fit_table(x, y, len(seen), num_classes, multi_label, balanced, c)
        progress.update(1)
    agreement = "" if multi_label else \
        f"; out of fold it agrees with {100 * float((out_of_fold.argmax(1) == y_all).mean()):.1f}% of their labels"
    log.info("n-gram bag: logistic regression (%s weights) on %d rows seen of %d, %d folds over %d training texts%s (%.0f s)%s",
             weighting, len(seen), bag.rows, len(folds), len(chosen), f" (a seeded sample of {n})" if len(rest) else "",
             time.perf_counter() - start, agreement)
    as_float = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float32))  # noqa: E731
    return {"out_of_fold": as_float(out_of_fold), "seen": torch.from_numpy(seen.astype(np.int64)),
            "table": as_float(table), "idf": as_float(w), "bias": as_float(bias)}


def fit(x_fitted, y_fitted, num_classes: int, multi_label: bool, balanced: bool, c: float):
    """One fold's regression, fitted on the other folds' texts: a function from TF-IDF rows to logits (N, C). A label
    on all of the fitted texts or on none (several labels), or one class only: that constant answer, ±UNSEEN_CLASS."""
    if multi_label:
        constant, varied = constant_labels(y_fitted)
        model = regression(True, False, c).fit(x_fitted, y_fitted[:, varied]) if len(varied) else None

        def score(x):
            logits = np.zeros((x.shape[0], num_classes))
            logits[:] = constant
            if model is not None:
                decision = model.decision_function(x)
                logits[:, varied] = decision.reshape(len(decision), -1)
            return logits

        return score
    classes = np.unique(y_fitted)
    if len(classes) == 1:

        def constant(x):
            logits = np.full((x.shape[0], num_classes), -UNSEEN_CLASS)
            logits[:, classes[0]] = 0.0
            return logits

        return constant
    model = regression(False, balanced, c).fit(x_fitted, y_fitted)
    return lambda x: as_logits(model, x, num_classes)
