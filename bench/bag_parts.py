"""What each part of a model with the fitted n-gram bag (network.ngram_fitted) answers on a labelled CSV, and what the
TF-IDF + LR peer answers when it too leaves out the tenth of the training rows a run holds out for validation.

    python -m bench.bag_parts RUN TEST_CSV                        # whole model, the bag alone, attention alone
    python -m bench.bag_parts RUN TEST_CSV --train TRAIN_CSV --draws 3

RUN: a run folder (its best checkpoint) or a checkpoint. TEST_CSV, TRAIN_CSV: the `text,label` files
`bench.subsets` writes. "attention alone" is the model's logits less the bag's (the attention path and its head).
The peer (training/ngram_teacher.py's recipe) is fitted on all training rows, then on `--draws` random 90% shares.
"""

import argparse
import csv
import sys
from pathlib import Path

import numpy as np
import torch

from bench.common import fit_ngram_teacher


def read_rows(path: Path) -> tuple[list[str], list[str]]:
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as e:
        sys.exit(f"error: {path}: {e.strerror}")
    if not rows or not {"text", "label"} <= set(rows[0]):
        sys.exit(f"error: {path}: needs rows with the columns text and label")
    return [r["text"] for r in rows], [r["label"] for r in rows]


def parts_accuracy(run: Path, texts: list[str], labels: list[str]) -> dict[str, float]:
    """Accuracy (%) of the whole network, its n-gram bag alone and the rest (logits less the bag's)."""
    from data.checkpoint import resolve_checkpoint
    from data.tokenizer import pad
    from inference.classifier import TextClassifier

    classifier = TextClassifier.from_checkpoint(str(resolve_checkpoint(run)), device="cpu")
    network = classifier.model.eval()
    if network.ngram_bag is None:
        sys.exit(f"error: {run}: the network has no n-gram bag (network.ngrams 0)")
    unknown = sorted(set(labels) - set(classifier.label_names))
    if unknown:
        sys.exit(f"error: labels {unknown[:3]} are not the checkpoint's ({classifier.label_names})")
    gold = torch.tensor([classifier.label_names.index(label) for label in labels])
    ids, _, _ = classifier.encode(texts)
    hits = dict.fromkeys(("whole", "bag alone", "attention alone"), 0)
    with torch.no_grad():
        for at in range(0, len(ids), 256):
            x, mask = pad(ids[at : at + 256])
            whole, bag = network(x, mask).logits, network.ngram_bag(x, mask)
            for name, logits in zip(hits, (whole, bag, whole - bag)):
                hits[name] += int((logits.argmax(1) == gold[at : at + 256]).sum())
    return {name: 100 * count / len(gold) for name, count in hits.items()}


def peer_accuracy(train, test, share: float, seed: int) -> float:
    texts, labels = train
    rows = np.random.default_rng(seed).permutation(len(texts))[: int(share * len(texts))]
    vectorizer, model = fit_ngram_teacher([texts[i] for i in rows], [labels[i] for i in rows])
    return 100 * float((model.predict(vectorizer.transform(test[0])) == np.array(test[1])).mean())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder or checkpoint of a model with the fitted n-gram bag")
    parser.add_argument("test", type=Path, help="the labelled CSV to score (text,label)")
    parser.add_argument("--train", type=Path, help="the run's training CSV: also fit the peer on it")
    parser.add_argument("--draws", type=int, default=3, help="random 90%% shares the peer is fitted on (%(default)s)")
    args = parser.parse_args(argv)
    test = read_rows(args.test)
    for name, accuracy in parts_accuracy(args.run, *test).items():
        print(f"{name:16s} {accuracy:6.2f}")
    if args.train:
        train = read_rows(args.train)
        print(f"{'peer, all rows':16s} {peer_accuracy(train, test, 1.0, 0):6.2f}")
        shares = [peer_accuracy(train, test, 0.9, seed) for seed in range(args.draws)]
        print(f"{'peer, 90%':16s} " + " ".join(f"{a:.2f}" for a in shares))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
