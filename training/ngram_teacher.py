"""An n-gram teacher for distillation: TF-IDF n-grams + logistic regression, the strongest cheap baseline on small
text sets, whose class probabilities become soft targets for the attention model (model.distillation).

The teacher's probabilities for the training texts are *out of fold*: the texts are cut into `folds` parts and
each part is scored by a teacher fitted on the other parts. A teacher scoring the texts it was fitted on would be
near-certain and right on almost all of them (hard labels again); out of fold it is as unsure as it is on unseen
text, and that uncertainty is what the student learns from. The student stays the attention model: the teacher
is used in training only, never saved in a checkpoint or run at prediction time.
"""

import logging
import time

import numpy as np
import torch

from data.columns import TextColumn
from data.progress import progress_bar
from data.sources import DataError

log = logging.getLogger(__name__)

FOLDS = 5
SAMPLE = 100_000  # most texts fitted on: SST-2's 67k phrases and IMDB's 22.5k reviews whole
CHUNK = 10_000  # texts turned into n-grams and scored at a time
# Most characters of fitted texts for the exact TF-IDF vocabulary (a Python dict of every n-gram seen, and a
# fitted matrix as wide): every dataset shipped here is below it (IMDB's 25,000 training reviews: 33M characters,
# SST-2 3.6M, ChnSentiCorp 1.0M). Above it the n-grams are hashed into HASH_FEATURES columns (HashedNgrams).
EXACT_CHARS = 40_000_000
HASH_FEATURES = 2**20


def is_cjk(texts: list[str], sample: int = 200) -> bool:
    """Mostly Chinese/Japanese/Korean characters (no spaces between words): character n-grams suit them."""
    joined = "".join(texts[:sample])
    return sum("\u3040" <= c <= "\u9fff" or "\uac00" <= c <= "\ud7af" for c in joined) > 0.3 * max(1, len(joined))


def ngram_settings(texts) -> dict:
    """Character 1-3-grams for CJK text, else word 1-2-grams."""
    if is_cjk(texts):
        return {"analyzer": "char", "ngram_range": (1, 3)}
    return {"analyzer": "word", "ngram_range": (1, 2), "token_pattern": r"(?u)\b\w+\b"}


def ngram_features(texts: list[str]):
    """A TF-IDF vectorizer for these texts (ngram_settings)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(**ngram_settings(texts), sublinear_tf=True)


class HashedNgrams:
    """TF-IDF of the same n-grams (ngram_settings), each counted in one of HASH_FEATURES columns chosen by its hash:
    no vocabulary is kept, so memory grows with the texts of a chunk, not with the n-grams seen; texts are counted
    CHUNK at a time. Weighted as TfidfVectorizer weighs them (sublinear tf, smoothed idf from the fitted texts, rows
    of unit length); float32."""

    def __init__(self, texts):
        from sklearn.feature_extraction.text import HashingVectorizer, TfidfTransformer

        self.hasher = HashingVectorizer(**ngram_settings(texts), n_features=HASH_FEATURES, alternate_sign=False,
                                        norm=None, dtype=np.float32)
        self.tfidf = TfidfTransformer(sublinear_tf=True)

    def counts(self, texts):
        import scipy.sparse

        return scipy.sparse.vstack([self.hasher.transform(texts[at : at + CHUNK])
                                    for at in range(0, len(texts), CHUNK)], format="csr")

    def fit_transform(self, texts):
        counts = self.counts(texts)
        if not counts.nnz:
            raise ValueError("empty vocabulary")  # as TfidfVectorizer says it
        self.tfidf.fit(counts)
        # Columns no fitted text has: weight 0, so that n-grams unseen in fitting count for nothing, as with the exact
        # vocabulary (which drops them), instead of diluting each text's unit length with their large idf.
        self.tfidf.idf_ = np.where(np.bincount(counts.indices, minlength=counts.shape[1]) > 0, self.tfidf.idf_, 0)
        return self.tfidf.transform(counts, copy=False)

    def transform(self, texts):
        return self.tfidf.transform(self.counts(texts), copy=False)


def fit_ngrams(texts, hashed: bool):
    """A vectorizer fitted on these texts (hashed: HashedNgrams, which reads them CHUNK at a time; else the exact
    vocabulary, ngram_features) and their TF-IDF matrix. sklearn's ValueError when the texts hold no n-gram."""
    texts = texts if hashed else list(texts)
    vectorizer = HashedNgrams(texts) if hashed else ngram_features(texts)
    return vectorizer, vectorizer.fit_transform(texts)


def fit_ngram_teacher(texts, labels, C: float = 4.0, class_weight: str | None = None, hashed: bool = False):
    """The recipe, written once (the teacher here, the TF-IDF peer of bench/accuracy.py): TF-IDF n-grams
    (fit_ngrams) + logistic regression fitted on these texts (class_weight: sklearn's, "balanced" for imbalanced
    classes). Returns (vectorizer, classifier); sklearn's ValueError when the texts hold no n-gram."""
    from sklearn.linear_model import LogisticRegression

    vectorizer, x = fit_ngrams(texts, hashed)
    return vectorizer, LogisticRegression(C=C, max_iter=2000, class_weight=class_weight).fit(x, labels)


def fitted_sample(texts: TextColumn, folds: int, sample: int, seed: int, exact_chars: int):
    """The size rule, for both teachers (out_of_fold_probabilities): (chosen, rest, hashed). chosen: the positions
    of the texts fitted on, all or a seeded sample of `sample` (in order); rest: the others, each scored by one fold's
    teacher; hashed: whether the chosen texts hold over `exact_chars` characters (HashedNgrams)."""
    n = len(texts)
    chosen = np.arange(n) if n <= sample else np.sort(np.random.default_rng(seed).choice(n, sample, replace=False))
    rest = np.setdiff1d(np.arange(n), chosen, assume_unique=True)
    hashed = sum(len(text or "") for text in texts.take(chosen)) > exact_chars
    log.info("n-gram teacher: scoring %d training texts out of fold (%d folds%s%s)", n, folds,
             f", fitted on a seeded sample of {len(chosen)}; each other text scored by one fold's teacher"
             if len(rest) else "", f"; n-grams hashed into {HASH_FEATURES} columns: over {exact_chars:,} characters"
             if hashed else "")
    return chosen, rest, hashed


def in_chunks(texts: TextColumn, rows: np.ndarray, vectorizer):
    """(rows, their TF-IDF matrix) for these positions of the texts, CHUNK at a time."""
    for at in range(0, len(rows), CHUNK):
        chunk = rows[at : at + CHUNK]
        yield chunk, vectorizer.transform(list(texts.take(chunk)))


def no_words(source: str) -> DataError:
    return DataError(f"{source}: the n-gram teacher found no words in the training texts; check text_column or "
                     "train without the teacher: --data.teacher null --model.distillation 0")


def out_of_fold_probabilities(texts, labels: list[int], num_classes: int, folds: int = FOLDS, seed: int = 0,
                              C: float = 4.0, source: str = "train", sample: int = SAMPLE,
                              class_weight: str | None = None, exact_chars: int = EXACT_CHARS) -> torch.Tensor:
    """(N, num_classes) float32 probabilities of an n-gram teacher for each training text, each from a teacher
    that did not see it (stratified folds, fixed by `seed`). `texts`: a TextColumn or a list of strings. `source`
    names the texts' file in errors.

    The size rule (fitted_sample), the same for one label a text and several (out_of_fold_label_probabilities):
    at most `sample` texts (a seeded sample when there are more) are fitted on, in folds: the n-gram vocabulary and
    the fitted matrix grow with the texts, the rest does not. Texts outside the sample are scored by one of the fold
    teachers each, CHUNK texts at a time, so memory stays bounded and time grows linearly beyond the sample.
    The rule for the n-grams: a sample of at most `exact_chars` characters (EXACT_CHARS, above every dataset shipped
    here) gets the exact TF-IDF vocabulary, as the published accuracies were trained with; a larger one hashed n-grams
    (HashedNgrams), whose memory does not grow with the vocabulary (no config on 100k IMDB-length texts: 1.6 GB peak to
    the first optimizer step, 3.6 GB with the exact vocabulary; docs/RESULTS.md "Memory and data size").
    class_weight "balanced": the teacher weighs each class the same, as the student's loss does on imbalanced
    classes (model.class_weights), so its soft targets do not pull the student back to the commonest class."""
    try:
        from sklearn.model_selection import StratifiedKFold
    except ImportError:
        raise DataError("data.teacher ngram needs scikit-learn: pip install scikit-learn") from None
    start = time.perf_counter()
    texts = texts if isinstance(texts, TextColumn) else TextColumn(list(texts))
    chosen, rest, hashed = fitted_sample(texts, folds, sample, seed, exact_chars)
    if labels and isinstance(labels[0], list):  # several labels a text
        return out_of_fold_label_probabilities(texts, labels, num_classes, folds, seed, C, source, chosen, rest,
                                               hashed, start)
    y, n = np.asarray(labels), len(labels)
    # Fewer folds when a class is rarer than the folds (StratifiedKFold needs a member of each class per fold).
    y_chosen = y[chosen]
    folds = max(2, min(folds, int(np.bincount(y_chosen, minlength=num_classes)[np.unique(y_chosen)].min())))
    probabilities = np.zeros((n, num_classes), dtype=np.float32)
    unseen = np.array_split(rest, folds)  # the texts outside the sample, a share for each fold's teacher
    splits = StratifiedKFold(folds, shuffle=True, random_state=seed).split(np.zeros(len(chosen)), y_chosen)
    with progress_bar(n, "n-gram teacher") as progress:
        for fold, (fitted, scored) in enumerate(splits):
            fitted, scored = chosen[fitted], np.concatenate([chosen[scored], unseen[fold]])
            classes = np.unique(y[fitted])
            if len(classes) < 2:  # a class with a single text: this fold's teacher knows one class only
                probabilities[np.ix_(scored, classes)] = 1.0
                progress.update(len(scored))
                continue
            fit_start = time.perf_counter()
            try:
                vectorizer, teacher = fit_ngram_teacher(texts.take(fitted), y[fitted], C, class_weight, hashed)
            except ValueError:  # sklearn: "empty vocabulary"
                raise no_words(source) from None
            log.info("n-gram teacher: fold %d of %d fitted on %d texts (%.0f s)", fold + 1, folds, len(fitted),
                     time.perf_counter() - fit_start)
            for rows, x in in_chunks(texts, scored, vectorizer):
                # Columns in class-id order; a class absent from this fold's texts keeps probability 0.
                probabilities[np.ix_(rows, teacher.classes_)] = teacher.predict_proba(x)
                progress.update(len(rows))
    probabilities = torch.from_numpy(probabilities)
    if class_weight == "balanced":
        probabilities = balanced_out_of_fold(probabilities, torch.from_numpy(y))
    agreement = float((probabilities.argmax(1).numpy() == y).mean())
    log.info("n-gram teacher: out-of-fold probabilities for %d training texts (%d folds, %.0f s); it agrees with "
             "%.1f%% of their labels", n, folds, time.perf_counter() - start, 100 * agreement)
    return probabilities


def balanced_out_of_fold(probabilities: torch.Tensor, labels: torch.Tensor, steps: int = 100) -> torch.Tensor:
    """The balanced teacher's out-of-fold probabilities shifted by one log-offset per class, fitted on them to
    minimise the class-balanced cross-entropy (scikit-learn's balanced weights, as the student's loss weighs the
    labels). Balanced weights make a fitted model's classes even on the texts it was fitted on; a rare class's
    few texts are the ones it fits closest, so on texts it did not see it calls many of that class the common one
    (SST-2 less 95% of its positives: out of fold, 51% of the positives and 98% of the negatives right at the
    argmax). The offsets are fitted on training texts only, each scored by a teacher that did not see it."""
    import torch.nn.functional as F

    from data.labels import balanced_weights, class_counts

    counts = class_counts(labels, probabilities.shape[1])
    weights = balanced_weights(counts, len(labels), multi_label=False).double()
    log_p = probabilities.double().clamp(min=1e-12).log()
    offsets = torch.zeros(probabilities.shape[1], dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([offsets], lr=0.1, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = F.cross_entropy(log_p + offsets, labels.long(), weight=weights)
        loss.backward()
        return loss

    optimizer.step(closure)
    offsets = (offsets - offsets.mean()).detach()
    log.info("n-gram teacher: class-balanced offsets of its out-of-fold log-probabilities: %s",
             ", ".join(f"{c} {v:+.2f}" for c, v in enumerate(offsets.tolist())))
    return (log_p + offsets).softmax(-1).float()


def out_of_fold_label_probabilities(texts: TextColumn, label_sets, num_classes, folds, seed, C, source, chosen, rest,
                                    hashed, start) -> torch.Tensor:
    """Several labels a text: (N, num_classes) probabilities that each label applies, one logistic regression per
    label (one-vs-rest) on the same TF-IDF n-grams, out of fold (plain folds: a text has no single class to
    stratify on). A label absent from a fold's texts gets probability 0 there, a label on all of them 1; fewer
    texts than folds: one fold a text; a single text: every label's training share. The size rule is the single-label
    teacher's (fitted_sample): `chosen` texts fitted on in folds, each of the `rest` scored by one fold's teacher,
    n-grams `hashed` or exact."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import KFold
    from sklearn.multiclass import OneVsRestClassifier

    y = np.zeros((len(texts), num_classes), dtype=np.int8)  # a byte a label: 28 labels of 10M texts take 280 MB
    for row, indices in enumerate(label_sets):
        y[row, indices] = 1
    probabilities = np.zeros((len(texts), num_classes), dtype=np.float32)
    if len(chosen) < 2:  # no text left out to score: each label's training share, the same for every text
        log.info("n-gram teacher: %d training text(s), too few for folds: every text gets the labels' training "
                 "shares", len(chosen))
        return torch.from_numpy(y.mean(0, dtype=np.float32)).expand(len(texts), num_classes).clone()
    if folds > len(chosen):
        log.info("n-gram teacher: %d folds for %d training texts (fewer texts than folds)", len(chosen), len(chosen))
        folds = len(chosen)
    unseen = np.array_split(rest, folds)  # the texts outside the sample, a share for each fold's teacher
    for fold, (fitted, scored) in enumerate(KFold(folds, shuffle=True, random_state=seed).split(chosen)):
        fitted, scored = chosen[fitted], np.concatenate([chosen[scored], unseen[fold]])
        labels = y[fitted].astype(np.int64)
        counts = labels.sum(0)
        # A label on every fitted text (or on none) has nothing to learn: its answer is that constant, 1 (or 0).
        probabilities[np.ix_(scored, np.flatnonzero(counts == len(fitted)))] = 1.0
        present = np.flatnonzero((counts > 0) & (counts < len(fitted)))
        if not len(present):
            continue
        try:
            vectorizer, x = fit_ngrams(texts.take(fitted), hashed)
            # Canonical (sorted, no duplicates): the label fits' processes get it read-only, and liblinear's input
            # check would otherwise sort it in place.
            x.sum_duplicates()
        except ValueError:  # sklearn: "empty vocabulary"
            raise no_words(source) from None
        # liblinear: one yes/no fit per label is what it is made for; on GoEmotions (28 labels, 35k texts a fold)
        # it fits in a fifth of lbfgs' time, its validation macro-F1 no lower (docs/LABELS.md "The n-gram teacher").
        # The labels' fits are independent: one process each, as many at once as torch may use threads.
        teacher = OneVsRestClassifier(LogisticRegression(C=C, solver="liblinear"), n_jobs=torch.get_num_threads())
        teacher.fit(x, labels[:, present])
        del x
        for rows, x in in_chunks(texts, scored, vectorizer):
            # One label left to fit: sklearn takes its one column as a yes/no class and answers (no, yes).
            answer = teacher.predict_proba(x)
            probabilities[np.ix_(rows, present)] = answer[:, 1:] if len(present) == 1 else answer
    log.info("n-gram teacher: out-of-fold label probabilities for %d training texts (%d folds, %.0f s)", len(texts),
             folds, time.perf_counter() - start)
    return torch.from_numpy(probabilities)
