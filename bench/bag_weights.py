"""The fitted n-gram bag alone (training/ngram_fit.py) with each feature weighting (network.ngram_weighting): tfidf
(idf, C = 4, the TF-IDF + LR peer's recipe) against nb (idf times NBSVM's log-count ratio, C = 16). For each dataset,
the data as `configs/default.yaml` makes it (the same tokens and n-gram rows a run's bag reads); the bag is fitted on
the training split and scored on validation, where the default was chosen, and on test where there is one; its
out-of-fold accuracy on the training split comes from the fit itself.

    python -m bench.bag_weights --datasets sst2 imdb chnsenticorp_htl

Prints a table and, last, one JSON line. Two classes, one label a text (nb needs them).
"""

import argparse
import json
import logging
import time

import numpy as np
import torch

from bench.common import ROOT, read_config
from model.config import max_length_caps

WEIGHTINGS = ("tfidf", "nb")
log = logging.getLogger("bench.bag_weights")


def encoded_splits(dataset: str, config: str = "configs/default.yaml", cache_dir=ROOT / ".cache", **files):
    """{split: EncodedSplit} and the vocabulary size of `dataset` (or of `files`: train_file=..., test_file=...) as
    `config`'s data section makes them."""
    from data.datamodule import TextDataModule

    settings = read_config(ROOT / config)
    data = {k: v for k, v in settings.get("data", {}).items() if k not in ("teacher", "dataset")} | files
    attention = settings.get("model", {}).get("network", {}).get("attention", "auto")
    module = TextDataModule(dataset=dataset, max_length_caps=max_length_caps(attention),
                            cache_dir=str(cache_dir), **data)
    names = [name for name in ("train", "validation", "test") if name in module.state["splits"]]
    return {name: module.split(name) for name in names}, module.vocab_size


def accuracy(bag, split) -> float:
    hits = 0
    with torch.no_grad():
        for at in range(0, len(split), 256):
            batch = split.__getitems__(list(range(at, min(at + 256, len(split)))))
            logits = bag(batch["input_ids"], batch["padding_mask"])
            hits += int((logits.argmax(1) == batch["labels"]).sum())
    return 100 * hits / len(split)


def measure(dataset: str, buckets: int = 2**20, **data) -> dict:
    from model.ngrams import NgramBag
    from training.ngram_fit import fit_ngram_bag

    splits, vocab_size = encoded_splits(dataset, **data)
    train = splits["train"]
    if train.labels.dim() != 1 or int(train.labels.max()) != 1:
        raise SystemExit(f"error: {dataset}: the nb weighting needs two classes and one label a text")
    row = {"dataset": dataset, "texts": {name: len(split) for name, split in splits.items()}}
    for weighting in WEIGHTINGS:
        bag = NgramBag(order=2, vocab_size=vocab_size, buckets=buckets, num_classes=2, fitted=True)
        holder = torch.nn.Module()
        holder.ngram_bag = bag
        start = time.perf_counter()
        out_of_fold = fit_ngram_bag([holder], train, multi_label=False, seed=0, balanced=False, fit_whole=True,
                                    weighting=weighting)
        row[weighting] = {"seconds": round(time.perf_counter() - start, 1),
                          "out of fold": 100 * float((out_of_fold.argmax(1) == train.labels).float().mean())}
        row[weighting] |= {name: accuracy(bag, split) for name, split in splits.items() if name != "train"}
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bag_weights", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["sst2", "imdb", "chnsenticorp_htl"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    rows = [measure(dataset) for dataset in args.datasets]
    print("| dataset | weighting | out of fold (train) | validation | test | fit, s |\n|---|---|---|---|---|---|")
    for row in rows:
        for weighting in WEIGHTINGS:
            r = row[weighting]
            test = f"{r['test']:.2f}" if "test" in r else "–"
            print(f"| {row['dataset']} | {weighting} | {r['out of fold']:.2f} | {r['validation']:.2f} | {test} | "
                  f"{r['seconds']} |")
    print(json.dumps(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
