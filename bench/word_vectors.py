"""How good are the skip-gram word vectors of training/word_vectors.py, before any fine-tuning? A linear probe:
logistic regression on each text's mean word vector, fitted on the training split, scored on validation, with
the data settings a no-config `train.py fit` would choose (its tokenizer and vocabulary).

    python -m bench.word_vectors --dataset imdb                      # this project's vectors, 5 epochs, lr 0.01
    python -m bench.word_vectors --dataset imdb --epochs 1 --lr 0.03

Prints the seconds the vectors took and the probe's validation accuracy (docs/RESULTS.md "Word vectors of the
training texts").
"""

import argparse
import logging
import sys
import time

import numpy as np
import torch


def mean_vectors(split, table: torch.Tensor) -> np.ndarray:
    """(texts, D): the mean word vector of each text of an EncodedSplit."""
    text = torch.repeat_interleave(torch.arange(len(split)), split.offsets[1:] - split.offsets[:-1])
    sums = torch.zeros(len(split), table.shape[1]).index_add_(0, text, table[split.ids.long()])
    return (sums / torch.tensor(split.lengths).clamp_min(1)[:, None]).numpy()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", default="sst2", help="a registered dataset (default sst2)")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args(argv)
    sys.argv = sys.argv[:1]  # read above; LightningCLI below gets its own arguments
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from sklearn.linear_model import LogisticRegression

    import train
    from training.word_vectors import skipgram_vectors

    cli = train.cli(["--data.dataset", args.dataset, "--data.teacher", "null", "--model.distillation", "0"], run=False)
    data, network = cli.datamodule, cli.model.network
    training, validation = data.split("train"), data.split("validation")
    start = time.perf_counter()
    table = skipgram_vectors(training.ids, training.offsets, network.vocab_size, network.d_model,
                             epochs=args.epochs, lr=args.lr)
    seconds = time.perf_counter() - start
    x, x_val = mean_vectors(training, table), mean_vectors(validation, table)
    mean, std = x.mean(0), x.std(0) + 1e-8
    probe = LogisticRegression(max_iter=2000).fit((x - mean) / std, training.labels.numpy())
    accuracy = probe.score((x_val - mean) / std, validation.labels.numpy())
    source = f"skip-gram, {args.epochs} epochs, lr {args.lr}"
    print(f"{args.dataset}: {source}: vectors {seconds:.0f} s; probe validation accuracy {100 * accuracy:.2f}%")


if __name__ == "__main__":
    main()
