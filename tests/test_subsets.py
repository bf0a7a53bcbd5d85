"""The subsets of bench/subsets.py and of the doctor's proof (bench/catalogue/proof.py subset): stratified,
reproducible, and never larger than asked."""

from collections import Counter

from bench.catalogue.proof import subset


def test_a_subset_keeps_each_class_share_and_is_the_same_for_the_same_seed():
    texts = [f"text {i}" for i in range(1000)]
    labels = [0] * 700 + [1] * 250 + [2] * 50
    chosen, chosen_labels = subset(texts, labels, 100, seed=3)
    assert Counter(chosen_labels) == {0: 70, 1: 25, 2: 5}
    assert len(set(chosen)) == 100 and all(labels[int(t.split()[1])] == y for t, y in zip(chosen, chosen_labels))
    assert subset(texts, labels, 100, seed=3) == (chosen, chosen_labels)
    assert subset(texts, labels, 100, seed=4)[0] != chosen
