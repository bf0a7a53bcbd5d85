"""A candidate measured and not shipped (issue 58): once a run's epoch is chosen on the validation split it held out of
the training rows, fit the n-gram bag again on training + validation rows together (11% more text for the
regression, as TF-IDF + LR gets all of them), and score the test split both ways.

    python -m bench.bag_refit RUN [RUN ...] --how refit folds folds-train    # runs of `python -m bench.subsets`

RUN: a run folder. Its best checkpoint is scored by `train.py test` as it is, then a copy for each --how
(RUN/refit/HOW.ckpt) with the bag fitted anew; the run itself is left as it was. Prints one JSON line a run: {"run",
"best", HOW: accuracy, ...}. Measured on SST-2 subsets, medians of seeds 0-2 (docs/RESULTS.md "A fitted n-gram bag"):
1,000 rows: as trained 71.10, refit 68.58, folds 69.38, folds-train 70.87; 5,000 rows: 77.29, 78.44, 78.21, 77.41.
No rule that helps both: not shipped.
"""

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch

HOW = {"refit": "one regression on training + validation rows",
       "folds": "the mean of 5 fold regressions on training + validation rows (each on 4 folds)",
       "folds-train": "the mean of 5 fold regressions on the training rows alone"}
REFIT_KEY = "ngram_bag_refit"  # the copy's record of the refit: {"texts": N, "splits": [...]}


def refit_checkpoint(source, target, splits: dict, bag, multi_label: bool, balanced: bool, folds: bool = False,
                     weighting: str = "tfidf") -> int:
    """The checkpoint at `source` written to `target` with its n-gram bag fitted again on the texts of `splits`
    ({name: EncodedSplit}) together (training/ngram_fit.py's regression): each network's table, idf and bias
    replaced (`model.`, and with ema_decay `_online.`), the rest as it was, REFIT_KEY added. With `folds`, the mean
    of the regressions fitted on each 4 folds of 5 (the training step's out-of-fold logits come from such fits, so
    the bag then speaks as loudly as it did in training). `weighting`: the run's network.ngram_weighting (its feature
    weights over all these texts). Returns the texts."""
    import scipy.sparse

    from data.checkpoint import load_safely
    from data.files import write_atomically
    from training.ngram_fit import C, bag_weighting, binary_rows, feature_weights, fit_table, folds_of, seen_rows, tfidf

    binary = scipy.sparse.vstack([binary_rows(split, bag, np.arange(len(split))) for split in splits.values()],
                                 format="csr")
    y = np.concatenate([split.labels.numpy().astype(np.int64) for split in splits.values()])
    seen, idf, binary = seen_rows(binary)
    weighting = bag_weighting(weighting, bag.bias.shape[0], multi_label)
    idf = feature_weights(binary, y, idf, weighting)
    x = tfidf(binary, idf)
    fit = lambda rows: fit_table(x[rows], y[rows], len(seen), bag.bias.shape[0], multi_label, balanced,  # noqa: E731
                                 C[weighting])
    if folds:
        fits = [fit(fitted) for fitted, _ in folds_of(y, multi_label, seed=0)]
        table, bias = np.mean([t for t, _ in fits], axis=0), np.mean([b for _, b in fits], axis=0)
    else:
        table, bias = fit(np.arange(len(y)))
    checkpoint = load_safely(source)
    state, seen = checkpoint["state_dict"], torch.from_numpy(seen.astype(np.int64))
    for key in [key for key in state if key.endswith("ngram_bag.table")]:
        prefix = key.removesuffix("table")
        state[key] = torch.zeros_like(state[key]).index_copy_(0, seen, torch.from_numpy(table).to(state[key]))
        state[prefix + "idf"] = torch.zeros_like(state[prefix + "idf"]).index_copy_(
            0, seen, torch.from_numpy(idf).to(state[prefix + "idf"]))
        state[prefix + "bias"] = torch.from_numpy(bias).to(state[prefix + "bias"])
    checkpoint[REFIT_KEY] = {"texts": int(binary.shape[0]), "splits": list(splits)}
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(target, lambda temporary: torch.save(checkpoint, temporary), "checkpoint")
    return int(binary.shape[0])


def test_accuracy(run: Path, checkpoint: Path):
    """`train.py test` of `checkpoint` with the run's config, in this process: (accuracy, the CLI)."""
    import train

    cli = train.main(["test", "--config", str(run / "config.yaml"), "--ckpt_path", str(checkpoint),
                      "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
                      "--trainer.default_root_dir", str(run / "scoring")])
    return float(cli.trainer.callback_metrics["test/acc"]), cli


def measure(run: Path, how: list[str]) -> dict:
    from data.checkpoint import resolve_checkpoint

    best = resolve_checkpoint(run)
    before, cli = test_accuracy(run, best)
    module, data = cli.model, cli.datamodule
    if not module.network.ngram_fitted:
        sys.exit(f"error: {run}: its network has no fitted n-gram bag (network.ngram_fitted)")
    row = {"run": str(run), "best": before}
    for name in how:
        refit = run / "refit" / f"{name}.ckpt"
        splits = ("train",) if name.endswith("-train") else ("train", "validation")
        row[f"{name} texts"] = refit_checkpoint(best, refit, {split: data.split(split) for split in splits},
                                        module.model.ngram_bag, module.hparams.multi_label,
                                        balanced=module.hparams.class_weights not in (None, "auto"),
                                        folds=name.startswith("folds"), weighting=module.network.ngram_weighting)
        row[name] = test_accuracy(run, refit)[0]
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.bag_refit", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--how", nargs="+", default=["refit"], choices=list(HOW),
                        help="; ".join(f"{k}: {v}" for k, v in HOW.items()))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for run in args.runs:
        if not (run / "config.yaml").is_file():
            sys.exit(f"error: {run}: not a run folder (no config.yaml)")
        print(json.dumps(measure(run, args.how)), flush=True)


if __name__ == "__main__":
    main()
