"""A bag of n-grams beside the attention path: each distinct n-gram of a text adds its own learned vote for each
class to the logits (a linear model on binary n-gram features, NBSVM's; Wang & Manning 2012).

    ids, present = ngram_ids(token_ids, key_padding_mask, order=2, vocab_size=V, buckets=K)   # (B, M) each
    logits = NgramBag(order=2, vocab_size=V, buckets=K, num_classes=C)(token_ids, key_padding_mask)  # (B, C)
    logits = NgramBag(..., fitted=True)(token_ids, key_padding_mask)  # w·x + b, x the text's TF-IDF n-grams

The n-grams are found from the token ids inside the network (no vocabulary of n-grams is kept, fastText's hashing
trick): a unigram is its token id (rows 0..V-1), a longer n-gram is hashed into one of K rows after them. A text
counts each of its n-grams once (binary features: a word said three times is not three times the evidence), and
n-grams reaching into padding count for nothing, so a text gets the same votes whatever its padding. The table is a
plain tensor in the checkpoint; its start can be naive-Bayes log-count ratios of the training texts
(training/ngram_start.py, nb_log_count_ratios below), as NBSVM weighs its features.

Fitted (network.ngram_fitted): the bag is the TF-IDF + LR recipe on these n-grams, a logistic regression fitted on
the training texts before the first step (training/ngram_fit.py) and never trained after: its table, idf and bias
are buffers, not parameters. A text's features are x_r = w_r / ||w over its distinct rows|| (binary tf,
unit length), its logits W x + b; w_r is the row's idf, times NBSVM's log-count ratio with two classes
(network.ngram_weighting; the buffer `idf` holds w).
Letters: B batch, L tokens, M n-gram places (L for each order), C classes.
"""

import torch
from torch import nn

# Hash of an n-gram (t_1, ..., t_n): h = t_1 mod K, then h = (h · PRIME + t_k) mod K for k = 2..n, in int64 without
# overflow for any K ≤ 2^31 and token ids below 2^31 (so ONNX Runtime computes the same rows as torch).
PRIME = 1_000_003


def ngram_ids(token_ids: torch.Tensor, key_padding_mask: torch.Tensor, order: int, vocab_size: int,
              buckets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The table rows of every n-gram (1..order tokens, all real) of each text, each distinct row of a text once.
    token_ids (B, L) int; key_padding_mask (B, L) bool, True at padding. Returns (rows (B, M) int64, present (B, M)
    bool): present is False at n-grams that reach into padding and at repeats of a row already counted."""
    token_ids = token_ids.long()
    real = ~key_padding_mask.bool()  # (B, L)
    B, L = token_ids.shape
    rows, valid = [token_ids], [real]
    hashed, inside = token_ids % buckets, real  # (B, L) each: the n-grams starting at each place, so far
    for n in range(2, order + 1):
        # the n-gram's n-th token, i + n - 1; places past the end read padding (never real)
        after = torch.cat([token_ids[:, n - 1:], token_ids.new_zeros(B, n - 1)], dim=1)  # (B, L)
        real_after = torch.cat([real[:, n - 1:], real.new_zeros(B, n - 1)], dim=1)
        hashed = (hashed * PRIME + after) % buckets  # (B, L) the hash of tokens i..i+n-1
        inside = inside & real_after
        rows.append(vocab_size + hashed)
        valid.append(inside)
    rows, valid = torch.cat(rows, dim=1), torch.cat(valid, dim=1)  # (B, M)
    # Each distinct row once: sorted, a row equal to its left neighbour is a repeat (invalid places sort last).
    rows = rows.masked_fill(~valid, vocab_size + buckets)
    rows, _ = rows.sort(dim=1)
    repeat = torch.cat([torch.zeros_like(rows[:, :1], dtype=torch.bool), rows[:, 1:] == rows[:, :-1]], dim=1)
    present = (rows < vocab_size + buckets) & ~repeat
    return rows.masked_fill(~present, 0), present


class NgramBag(nn.Module):
    """Logits from a text's distinct n-grams: the sum of their rows of a (vocab_size + buckets, C) table."""

    def __init__(self, *, order: int, vocab_size: int, buckets: int, num_classes: int, fitted: bool = False):
        super().__init__()
        self.order, self.vocab_size, self.buckets, self.fitted = order, vocab_size, buckets, fitted
        rows = vocab_size + buckets
        if fitted:  # zeros until fitted: the branch says nothing
            self.register_buffer("table", torch.zeros(rows, num_classes))
            self.register_buffer("idf", torch.zeros(rows))
            self.register_buffer("bias", torch.zeros(num_classes))
            return
        # Zero start: the branch says nothing until trained (or started from naive Bayes, nb_start).
        self.ngram_embedding = nn.Embedding(rows, num_classes)
        nn.init.zeros_(self.ngram_embedding.weight)

    def ids(self, token_ids: torch.Tensor, key_padding_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return ngram_ids(token_ids, key_padding_mask, self.order, self.vocab_size, self.buckets)

    @property
    def rows(self) -> int:
        return self.vocab_size + self.buckets

    def forward(self, token_ids: torch.Tensor, key_padding_mask: torch.Tensor) -> torch.Tensor:
        rows, present = self.ids(token_ids, key_padding_mask)  # (B, M) each
        if self.fitted:
            x = self.idf[rows] * present  # (B, M)
            x = x / x.norm(dim=1, keepdim=True).clamp(min=1e-12)  # unit length, as TfidfVectorizer's rows
            return (self.table[rows] * x.unsqueeze(-1)).sum(dim=1) + self.bias  # (B, C)
        votes = self.ngram_embedding(rows) * present.unsqueeze(-1)  # (B, M, C)
        return votes.sum(dim=1)  # (B, C)


def nb_log_count_ratios(counts: torch.Tensor, texts_with: torch.Tensor, multi_label: bool,
                        smoothing: float = 1.0) -> torch.Tensor:
    """(F, C) naive-Bayes weights of F binary features for C classes. counts (F, C): in how many texts of each class
    (one label a text) or with each label (several) each feature occurs; texts_with (F,): in how many texts at all.
    One label a text: log p(feature | class), add-`smoothing`, less its mean over the classes (for two classes ±½
    NBSVM's log-count ratio r, so that the difference of the two logits is r). Several labels: each label's r, its
    positives' p against its negatives'. A feature no training text has gets 0: it says nothing."""
    counts, seen = counts.double(), (texts_with > 0).unsqueeze(1)  # (F, C), (F, 1)
    features = int(seen.sum())

    def log_share(c):  # log p(feature | texts counted in c), add-smoothing over the features seen
        return ((c + smoothing) / (c.sum(0, keepdim=True) + smoothing * features)).log()

    if multi_label:
        weights = log_share(counts) - log_share(texts_with.double().unsqueeze(1) - counts)
    else:
        weights = log_share(counts)
        weights = weights - weights.mean(1, keepdim=True)
    return (weights * seen).float()
