"""bench/subsets.py draws a user's-own-file subset: stratified, reproducible, and never larger than asked."""

from collections import Counter

from bench.subsets import split_off
from monitor.catalogue.proof import subset


def test_a_subset_keeps_each_class_share_and_is_the_same_for_the_same_seed():
    texts = [f"text {i}" for i in range(1000)]
    labels = [0] * 700 + [1] * 250 + [2] * 50
    chosen, chosen_labels = subset(texts, labels, 100, seed=3)
    assert Counter(chosen_labels) == {0: 70, 1: 25, 2: 5}
    assert len(set(chosen)) == 100 and all(labels[int(t.split()[1])] == y for t, y in zip(chosen, chosen_labels))
    assert subset(texts, labels, 100, seed=3) == (chosen, chosen_labels)
    assert subset(texts, labels, 100, seed=4)[0] != chosen


def test_tuning_rows_are_set_aside_from_what_subsets_are_drawn_from():
    texts = [f"text {i}" for i in range(500)]
    labels = [i % 2 for i in range(500)]
    (rest, rest_labels), (aside, aside_labels) = split_off(texts, labels, 120, seed=0)
    assert len(aside) == 120 and len(rest) == 380 and not set(aside) & set(rest)
    assert all(labels[int(t.split()[1])] == y for t, y in zip(aside + rest, aside_labels + rest_labels))
    chosen, _ = subset(rest, rest_labels, 100, seed=0)
    assert not set(chosen) & set(aside)  # a subset never holds a row it is scored on
    assert split_off(texts, labels, 120, seed=0)[1] == (aside, aside_labels)
