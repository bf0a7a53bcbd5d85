"""The generic default on data nobody tuned for: random subsets of a dataset's training split handed to
`train.py fit` as a user's own CSV files, with no config at all, against TF-IDF + logistic regression on the same
rows.

    python -m bench.subsets                                   # SST-2 and ChnSentiCorp, 1,000 and 5,000 rows, seed 0
    python -m bench.subsets --datasets sst2 --rows 1000 --seeds 0 1 2

For each dataset and size: a stratified random subset of the training split (`--rows`, drawn with the seed) is
written to train.csv; the run holds its own validation split out of it (data.val_fraction, as for any own file) and
chooses its checkpoint there. The reported figure is a split the run never saw: the dataset's test split
(ChnSentiCorp's fixed 10%, IMDB's official test set), or for SST-2, which has none, its validation split (872),
written as test.csv. The peer is fitted on the same subset (training/ngram_teacher.py's recipe). Prints a table and, last, one
JSON line. Arguments after `--` go to every `train.py fit` (a setting to compare).
"""

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
from pathlib import Path

from bench.accuracy import accuracy, score_run
from bench.common import ROOT, fit_ngram_teacher
from data.sources import load_splits
from bench.catalogue.proof import subset, write_csv

log = logging.getLogger("bench.subsets")


def measure(dataset: str, rows: int, seed: int, out: Path, threads: int, extra: tuple[str, ...] = ()) -> dict:
    splits = load_splits(dataset=dataset, data_dir=None, train_file=None, val_file=None, test_file=None,
                         text_column=None, label_column=None, val_fraction=0.1, seed=0)
    pool = splits.texts["train"], splits.labels["train"]
    held_out = "test" if "test" in splits.texts else "validation"
    scored_texts, scored_labels = splits.texts[held_out], splits.labels[held_out]
    folder = out / f"{dataset}-{rows}-seed{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    texts, labels = subset(*pool, rows, seed)
    train_file = write_csv(folder / "train.csv", texts, labels, splits.label_names)
    test_file = write_csv(folder / "test.csv", scored_texts, scored_labels, splits.label_names)
    vectorizer, classifier = fit_ngram_teacher(texts, labels)
    peer = accuracy(classifier.predict(vectorizer.transform(scored_texts)), scored_labels)
    done = sorted(folder.glob("lightning_logs/version_*/checkpoints/last.ckpt"))
    if not done:
        command = [sys.executable, "train.py", "fit", "--data.train_file", str(train_file), "--data.test_file",
                   str(test_file), "--seed_everything", str(seed), "--trainer.default_root_dir", str(folder),
                   "--trainer.enable_progress_bar", "false", *extra]
        log.info("running %s", " ".join(command))
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                                env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        if result.returncode != 0:
            raise SystemExit(f"failed: {' '.join(command)}\n{result.stderr[-3000:]}")
        done = sorted(folder.glob("lightning_logs/version_*/checkpoints/last.ckpt"))
    run = done[-1].parent.parent
    scored = score_run(run, "test")
    return {"dataset": dataset, "requested_rows": rows, "rows": len(texts), "seed": seed, "reported_split": held_out,
            "model": scored["accuracy"], "tfidf_logreg": peer, "minutes": scored["minutes"], "run": str(run)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=["sst2", "chnsenticorp_htl"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1000, 5000])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "subsets")
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS of each run (%(default)s)")
    parser.add_argument("extra", nargs="*", help="train.py arguments after --, e.g. -- --model.network.d_model 64")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    results = [measure(d, n, s, args.out, args.threads, tuple(args.extra))
               for d in args.datasets for n in args.rows for s in args.seeds]
    print("\n| dataset (reported split) | training rows | no config (median) | TF-IDF + LR (median) | gap | minutes |"
          "\n|---|---:|---:|---:|---:|---:|")
    for dataset in args.datasets:
        for rows in args.rows:
            group = [r for r in results if r["dataset"] == dataset and r["requested_rows"] == rows]
            model = statistics.median(r["model"] for r in group)
            peer = statistics.median(r["tfidf_logreg"] for r in group)
            print(f"| {dataset} ({group[0]['reported_split']}) | {rows:,} | {100 * model:.2f} | {100 * peer:.2f} | "
                  f"{100 * (model - peer):+.2f} | {statistics.median(r['minutes'] for r in group):.1f} |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
