"""The fitted n-gram bag (network.ngram_fitted): the TF-IDF + LR recipe on the network's own n-gram rows
(model/ngrams.py), fitted on the training split before the first step, and the out-of-fold logits that let the
attention path learn what the bag gets wrong (stacking, Wolpert 1992).

    x_r = idf_r / ||idf over the text's distinct rows||        binary tf, unit length (TfidfVectorizer's rows)
    idf_r = ln((1 + N) / (1 + df_r)) + 1, 0 for a row no training text has (it says nothing)
    logits = W x + b                                            logistic regression, C = 4 (the teacher's)

The training texts are cut into folds; each text's logits come from a regression fitted on the other folds, and
the training step adds those to the attention path's logits instead of the bag's own (model/classifier.py
ngram_logits). A bag fitted on a text is near-certain and right on it, so the attention path would learn nothing
from the texts it is trained on; out of fold the bag is as unsure as it is on unseen text, and the attention path
learns to correct it there. Validation, test and prediction read the bag fitted on every training text, as the
checkpoint holds it (buffers, not parameters: the optimizer never moves them).
"""

import logging
import time

import numpy as np
import torch

from data.progress import progress_bar
from model.ngrams import NgramBag

log = logging.getLogger(__name__)
FOLDS = 5
C = 4.0  # the n-gram teacher's (training/ngram_teacher.py fit_ngram_teacher)
BATCH = 512  # texts turned into n-gram rows at a time
UNSEEN_CLASS = 10.0  # a class a fold's regression never saw: this far under the text's lowest logit


def binary_rows(split, bag: NgramBag):
    """(N, F) scipy CSR of 1s: the distinct n-gram rows of each text of an EncodedSplit, as the bag reads them."""
    import scipy.sparse

    indptr, indices = [0], []
    for at in range(0, len(split), BATCH):
        batch = split.__getitems__(list(range(at, min(at + BATCH, len(split)))))
        rows, present = bag.ids(batch["input_ids"], batch["padding_mask"])  # (B, M) each
        for text_rows, text_present in zip(rows, present, strict=True):
            found = text_rows[text_present].numpy()
            indices.append(found)
            indptr.append(indptr[-1] + len(found))
    indices = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    return scipy.sparse.csr_matrix((np.ones(len(indices), dtype=np.float32), indices, np.asarray(indptr)),
                                   shape=(len(split), bag.rows))


def tfidf(binary, idf: np.ndarray):
    """Rows of `binary` weighed by idf and scaled to unit length (a text with no row seen stays 0)."""
    import scipy.sparse

    x = binary @ scipy.sparse.diags(idf.astype(np.float32))
    norms = np.sqrt(np.asarray(x.multiply(x).sum(axis=1)).ravel())
    return scipy.sparse.diags(1 / np.maximum(norms, 1e-12).astype(np.float32)) @ x


def regression(multi_label: bool, balanced: bool):
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    if multi_label:  # one yes/no fit per label, as the teacher's (training/ngram_teacher.py)
        return OneVsRestClassifier(LogisticRegression(C=C, solver="liblinear"))
    return LogisticRegression(C=C, max_iter=2000, class_weight="balanced" if balanced else None)


def as_logits(model, x, num_classes: int) -> np.ndarray:
    """(N, num_classes) logits of a fitted one-label regression, whose softmax is its predict_proba. Two classes:
    ±d/2 of its one decision value; a class it never saw: UNSEEN_CLASS under the lowest."""
    decision, classes = model.decision_function(x), model.classes_
    if len(classes) == 2:
        decision = np.stack([-decision / 2, decision / 2], axis=1)
    logits = np.full((x.shape[0], num_classes), np.nan)
    logits[:, classes] = decision
    return np.where(np.isnan(logits), decision.min(1, keepdims=True) - UNSEEN_CLASS, logits)


def fit_table(x, y, rows: int, num_classes: int, multi_label: bool, balanced: bool) -> tuple[np.ndarray, np.ndarray]:
    """(table (F, C), bias (C,)): the regression fitted on every training text in the bag's form, logits =
    table[rows]·x + bias. A class no text has (or, several labels, a label on every text or on none): its constant
    answer in the bias, UNSEEN_CLASS from the others."""
    table, bias = np.zeros((rows, num_classes)), np.zeros(num_classes)
    if multi_label:
        counts = y.sum(0)
        bias[counts == len(y)], bias[counts == 0] = UNSEEN_CLASS, -UNSEEN_CLASS
        varied = np.flatnonzero((counts > 0) & (counts < len(y)))
        if len(varied):
            estimators = regression(True, False).fit(x, y[:, varied]).estimators_
            table[:, varied] = np.concatenate([e.coef_ for e in estimators]).T
            bias[varied] = np.concatenate([e.intercept_ for e in estimators])
        return table, bias
    classes = np.unique(y)
    bias[:] = -UNSEEN_CLASS
    if len(classes) == 1:
        bias[classes[0]] = 0.0
        return table, bias
    model = regression(False, balanced).fit(x, y)
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


def fit_ngram_bag(networks, split, multi_label: bool, seed: int, balanced: bool, fit_whole: bool) -> torch.Tensor:
    """The out-of-fold logits (N, C) float32 of the training split (an EncodedSplit) and, with fit_whole (a fresh
    fit), each network's bag set to the regression fitted on every training text. Returns the logits."""
    start = time.perf_counter()
    bag = networks[0].ngram_bag
    num_classes = bag.bias.shape[0]
    binary = binary_rows(split, bag)
    df = np.bincount(binary.indices, minlength=bag.rows)
    idf = np.where(df > 0, np.log((1 + len(split)) / (1 + df)) + 1, 0.0)
    x = tfidf(binary, idf)
    labels = split.labels.numpy()
    y = labels.astype(np.int64)
    out_of_fold = np.zeros((len(split), num_classes), dtype=np.float32)
    folds = folds_of(y, multi_label, seed)
    with progress_bar(len(folds) + fit_whole, "n-gram bag") as progress:
        for fitted, scored in folds:
            out_of_fold[scored] = fit(x[fitted], y[fitted], x[scored], num_classes, multi_label, balanced)
            progress.update(1)
        if fit_whole:
            table, bias = fit_table(x, y, bag.rows, num_classes, multi_label, balanced)
            with torch.no_grad():
                for network in networks:
                    network.ngram_bag.table.copy_(torch.from_numpy(table))
                    network.ngram_bag.idf.copy_(torch.from_numpy(idf))
                    network.ngram_bag.bias.copy_(torch.from_numpy(bias))
            progress.update(1)
    target = y if not multi_label else None
    agreement = "" if target is None else \
        f"; out of fold it agrees with {100 * float((out_of_fold.argmax(1) == target).mean()):.1f}% of their labels"
    log.info("n-gram bag: logistic regression on %d rows seen of %d, %d folds over %d training texts (%.0f s)%s",
             int((df > 0).sum()), bag.rows, len(folds), len(split), time.perf_counter() - start, agreement)
    return torch.from_numpy(out_of_fold)


def fit(x_fitted, y_fitted, x_scored, num_classes: int, multi_label: bool, balanced: bool) -> np.ndarray:
    """One fold: logits of the scored texts from a regression fitted on the others. A label on all of the fitted
    texts or on none (several labels), or one class only: that constant answer, ±UNSEEN_CLASS."""
    if multi_label:
        logits = np.zeros((x_scored.shape[0], num_classes))
        counts = y_fitted.sum(0)
        logits[:, counts == len(y_fitted)], logits[:, counts == 0] = UNSEEN_CLASS, -UNSEEN_CLASS
        varied = np.flatnonzero((counts > 0) & (counts < len(y_fitted)))
        if len(varied):
            model = regression(True, False).fit(x_fitted, y_fitted[:, varied])
            decision = model.decision_function(x_scored)
            logits[:, varied] = decision.reshape(len(decision), -1)
        return logits
    classes = np.unique(y_fitted)
    if len(classes) == 1:
        logits = np.full((x_scored.shape[0], num_classes), -UNSEEN_CLASS)
        logits[:, classes[0]] = 0.0
        return logits
    return as_logits(regression(False, balanced).fit(x_fitted, y_fitted), x_scored, num_classes)
