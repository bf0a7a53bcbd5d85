"""The n-gram branch's start (model.ngram_start): naive-Bayes log-count ratios of the training texts, as NBSVM weighs
its features (Wang & Manning 2012), scaled by ngram_start. Counted from the training split's token ids with the
network's own n-gram rows (model/ngrams.py), so every row the branch can read is counted the way it reads it."""

import logging
import time

import torch

from model.ngrams import NgramBag, nb_log_count_ratios

log = logging.getLogger(__name__)
BATCH = 256  # texts counted at a time


def ngram_counts(split, bag: NgramBag, num_classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(counts (F, C), texts_with (F,)) over an EncodedSplit: in how many texts of each class (or with each label,
    multi-hot labels) each of the bag's F rows occurs, and in how many texts at all."""
    rows_total = bag.ngram_embedding.num_embeddings
    counts = torch.zeros(rows_total, num_classes, dtype=torch.float64)
    texts_with = torch.zeros(rows_total, dtype=torch.float64)
    for at in range(0, len(split), BATCH):
        batch = split.__getitems__(list(range(at, min(at + BATCH, len(split)))))
        rows, present = bag.ids(batch["input_ids"], batch["padding_mask"])  # (B, M)
        labels = batch["labels"]
        text, place = present.nonzero(as_tuple=True)  # (K,) each: the distinct n-grams of the batch's texts
        found = rows[text, place]
        texts_with.index_add_(0, found, torch.ones(len(found), dtype=torch.float64))
        if labels.ndim == 2:  # several labels a text: multi-hot (B, C)
            counts.index_add_(0, found, labels[text].double())
        else:
            counts.index_put_((found, labels[text].long()), torch.ones(len(found), dtype=torch.float64),
                              accumulate=True)
    return counts, texts_with


def start_from_naive_bayes(networks, split, scale: float, multi_label: bool) -> None:
    """Before the first step of a fresh fit: each network's n-gram table set to `scale` × the naive-Bayes weights of
    the training split (an EncodedSplit)."""
    start = time.perf_counter()
    bag = networks[0].ngram_bag
    counts, texts_with = ngram_counts(split, bag, bag.ngram_embedding.embedding_dim)
    table = scale * nb_log_count_ratios(counts, texts_with, multi_label)
    with torch.no_grad():
        for network in networks:
            network.ngram_bag.ngram_embedding.weight.copy_(table)
    log.info("n-gram branch: naive-Bayes start × %g from %d training texts, %d of %d rows seen (%.0f s)", scale,
             len(split), int((texts_with > 0).sum()), len(texts_with), time.perf_counter() - start)
