"""Batches: texts of similar length drawn together (BucketBatchSampler), padded per batch to the longest (collate).

A batch is a dict: input_ids (B, L) long, padding_mask (B, L) bool with True at padding (from the texts' lengths,
data.tokenizer.pad), labels (B,) long (several labels a text: (B, C) float, 1 where a label applies); with a
teacher's soft targets attached to the training split (training/teacher.py), training batches also hold
teacher_probs (B, C); with a fitted n-gram bag (training/ngram_fit.py), ngram_logits (B, C).
"""

import random

import torch
from torch.utils.data import DataLoader, Sampler

from data.labels import class_counts
from data.tokenizer import pad


def balanced_draws(labels: torch.Tensor, num_classes: int) -> list[float]:
    """Each text's weight in BucketBatchSampler's draws, 1 / (texts of its class): every class is drawn as often,
    the texts of a class equally often (the balanced sampler, data.balanced_sampler)."""
    counts = class_counts(labels, num_classes)
    return (1.0 / counts[labels.long()]).tolist()


def collate(items) -> dict[str, torch.Tensor]:
    """(ids, label[, {name: row attached}]) items → a batch padded to its longest text; padding_mask from the lengths
    (data.tokenizer.pad), as prediction builds it. A batch already made (EncodedSplit.__getitems__) passes as it is."""
    if isinstance(items, dict):
        return items
    input_ids, padding_mask = pad([item[0] for item in items])
    batch = {"input_ids": input_ids, "padding_mask": padding_mask, "labels": torch.stack([item[1] for item in items])}
    if len(items[0]) == 3:  # the training split with rows attached (a teacher's, the n-gram bag's)
        batch |= {name: torch.stack([item[2][name] for item in items]) for name in items[0][2]}
    return batch


class BucketBatchSampler(Sampler[list[int]]):
    """Batches of similar length, so little compute goes to padding: shuffle, sort within pools of 50 batches,
    cut into batches, shuffle the batches. With several processes, each takes every world_size-th batch.
    With `weights` (one per text, shuffle only), an epoch is as many texts drawn with replacement in proportion to
    them instead of each text once: balanced_draws gives every class the same share of the batches.
    Each epoch's order is drawn from seed + epoch: the trainer's epoch when `epoch_of` is given (a resumed run, and
    every process, draw the same), else a count of the passes begun."""

    def __init__(self, lengths, batch_size, shuffle, seed=0, rank=0, world_size=1, pool_batches=50, weights=None,
                 epoch_of=None):
        self.lengths, self.batch_size, self.shuffle, self.seed = lengths, batch_size, shuffle, seed
        self.rank, self.world_size, self.pool = rank, world_size, pool_batches * batch_size
        self.weights = weights if shuffle else None
        self.epoch, self.epoch_of = 0, epoch_of

    def batches(self) -> list[list[int]]:
        rng = random.Random(self.seed + self.epoch)
        order = list(range(len(self.lengths)))
        if self.weights is not None:
            order = rng.choices(order, weights=self.weights, k=len(order))
        elif self.shuffle:
            rng.shuffle(order)
        batches = []
        for start in range(0, len(order), self.pool):
            pool = sorted(order[start : start + self.pool], key=self.lengths.__getitem__)
            batches += [pool[i : i + self.batch_size] for i in range(0, len(pool), self.batch_size)]
        if self.shuffle:
            rng.shuffle(batches)
            batches = batches[: len(batches) // self.world_size * self.world_size]  # equal steps on every rank
        return batches[self.rank :: self.world_size]

    def __iter__(self):
        # Counted when a pass begins: Lightning stops reading after len(self) batches, so code after the last
        # yield would never run (every epoch would repeat the first one's order).
        if self.epoch_of is not None:
            self.epoch = self.epoch_of()
        batches = self.batches()
        self.epoch += 1
        yield from batches

    def __len__(self):
        n = -(-len(self.lengths) // self.batch_size)
        return n // self.world_size if self.shuffle else len(range(self.rank, n, self.world_size))


def loader(split, batch_size: int, shuffle: bool, seed: int, pool_batches: int, weights, num_workers: int,
           trainer=None) -> DataLoader:
    """A split's DataLoader: BucketBatchSampler's batches, collated; with a trainer, this process's share of them
    (its rank among world_size) and each epoch's order drawn from the trainer's epoch."""
    rank, world = (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)
    epoch_of = (lambda: trainer.current_epoch) if trainer is not None else None
    sampler = BucketBatchSampler(split.lengths, batch_size, shuffle, seed, rank, world, pool_batches, weights, epoch_of)
    return DataLoader(split, batch_sampler=sampler, collate_fn=collate, num_workers=num_workers,
                      persistent_workers=num_workers > 0)
