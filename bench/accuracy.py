"""Validation accuracy of this model (several seeds) against TF-IDF + logistic regression, NB-LR (naive-Bayes
weighted n-grams, Wang & Manning 2012) and fastText, on the same splits. The README's results table comes from
this script.

    python bench/accuracy.py --jobs 2                 # SST-2 and ChnSentiCorp, 3 seeds each, two runs at a time
    python bench/accuracy.py --datasets sst2 --seeds 0
    python bench/accuracy.py --peers-only             # the peers alone, about a minute

Needs the `bench` extra for the peers: pip install -e ".[bench]". The model runs are ordinary `train.py fit` runs
(their logs and checkpoints stay under --out); the accuracy reported for a run is its best validation accuracy
over epochs, i.e. the checkpoint train.py keeps as best.
"""

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import numpy as np
import torch
import yaml

from data.sources import load_splits

ROOT = Path(__file__).resolve().parents[1]

CONFIGS = {"sst2": "configs/sst2.yaml", "chnsenticorp_htl": "configs/chnsenticorp_htl.yaml"}
log = logging.getLogger("bench.accuracy")


def splits_for(config: str):
    data = (yaml.safe_load((ROOT / config).read_text()) or {}).get("data", {})
    return load_splits(
        dataset=data.get("dataset", "sst2"), data_dir=data.get("data_dir"), train_file=data.get("train_file"),
        val_file=data.get("val_file"), test_file=data.get("test_file"), text_column=data.get("text_column"),
        label_column=data.get("label_column"), val_fraction=data.get("val_fraction", 0.1), seed=data.get("seed", 0),
    )


def is_chinese(texts) -> bool:
    sample = "".join(texts[:200])
    return sum("\u4e00" <= c <= "\u9fff" for c in sample) > 0.3 * len(sample)


def tfidf_logreg(splits) -> float:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    chinese = is_chinese(splits.texts["train"])
    # Character 1-3-grams for Chinese (no word boundaries), word 1-2-grams otherwise.
    vectorizer = TfidfVectorizer(analyzer="char" if chinese else "word", ngram_range=(1, 3) if chinese else (1, 2),
                                 sublinear_tf=True)
    x_train = vectorizer.fit_transform(splits.texts["train"])
    classifier = LogisticRegression(C=4.0, max_iter=2000).fit(x_train, splits.labels["train"])
    return float((classifier.predict(vectorizer.transform(splits.texts["validation"])) == splits.labels["validation"]).mean())


def nb_logreg(splits) -> float:
    probabilities = nb_logreg_probabilities(splits)
    return float((probabilities.argmax(1) == np.array(splits.labels["validation"])).mean())


def nb_logreg_probabilities(splits) -> np.ndarray:
    """Binary n-gram features scaled by their naive-Bayes log-count ratio, then logistic regression (NBSVM's
    logistic cousin): among the strongest bag-of-n-grams sentiment classifiers. Returns its class probabilities
    for the validation texts, (N, 2), columns in label id order."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    chinese = is_chinese(splits.texts["train"])
    vectorizer = CountVectorizer(analyzer="char" if chinese else "word", ngram_range=(1, 2), binary=True,
                                 token_pattern=None if chinese else r"\S+")
    x_train, y_train = vectorizer.fit_transform(splits.texts["train"]), np.array(splits.labels["train"])
    if set(y_train) != {0, 1}:
        raise ValueError("NB-LR is for two classes")
    positive = np.asarray(x_train[y_train == 1].sum(0)).ravel() + 1  # add-one smoothed feature counts per class
    negative = np.asarray(x_train[y_train == 0].sum(0)).ravel() + 1
    ratio = np.log((positive / positive.sum()) / (negative / negative.sum()))
    classifier = LogisticRegression(C=1.0, max_iter=3000).fit(x_train.multiply(ratio).tocsr(), y_train)
    return classifier.predict_proba(vectorizer.transform(splits.texts["validation"]).multiply(ratio).tocsr())


def fasttext_accuracy(splits) -> float:
    import fasttext

    chinese = is_chinese(splits.texts["train"])

    def line(text):
        text = " ".join(text) if chinese else text  # characters as words for Chinese
        return " ".join(text.lower().split())

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        for text, label in zip(splits.texts["train"], splits.labels["train"]):
            f.write(f"__label__{label} {line(text)}\n")
    try:
        model = fasttext.train_supervised(f.name, epoch=25, wordNgrams=2, dim=100, lr=0.1, thread=1, seed=0, verbose=0)
    finally:
        os.unlink(f.name)
    predicted = [int(model.predict(line(t))[0][0].removeprefix("__label__")) for t in splits.texts["validation"]]
    return float(sum(p == y for p, y in zip(predicted, splits.labels["validation"])) / len(predicted))


def train_run(config: str, seed: int, out: Path, extra: list[str], threads: int | None = None) -> dict:
    """One `train.py fit` run; returns its best and last validation accuracy and wall time."""
    save_dir = out / f"{Path(config).stem}-seed{seed}"
    command = [sys.executable, str(ROOT / "train.py"), "fit", "--config", str(ROOT / config), "--seed_everything",
               str(seed), "--trainer.logger.init_args.save_dir", str(save_dir), "--trainer.enable_progress_bar", "false",
               *extra]
    log.info("running %s", " ".join(command))
    start = time.perf_counter()
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"training failed ({config}, seed {seed}):\n{result.stderr[-3000:]}")
    last = max(save_dir.glob("lightning_logs/version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
    checkpoint = torch.load(last, weights_only=True, map_location="cpu")
    best = max(float(state["best_model_score"]) for key, state in checkpoint["callbacks"].items() if "ModelCheckpoint" in key)
    return {"seed": seed, "best_val_acc": best, "seconds": round(seconds, 1), "checkpoint": str(last)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds for this model (%(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "accuracy", help="where runs are written (%(default)s)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="training runs at once; with 2 on a 2-core machine each gets one thread (%(default)s)")
    parser.add_argument("--peers-only", action="store_true", help="only the peers: TF-IDF + LR, NB-LR, fastText")
    parser.add_argument("--model-only", action="store_true", help="only this model")
    parser.add_argument("extra", nargs="*", help="extra train.py arguments after --, e.g. -- --trainer.max_epochs 1")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    results = {}
    for name in args.datasets:
        config = CONFIGS[name]
        row = results[name] = {}
        if not args.model_only:
            splits = splits_for(config)
            row["tfidf_logreg"] = tfidf_logreg(splits)
            row["nb_logreg"] = nb_logreg(splits)
            try:
                row["fasttext"] = fasttext_accuracy(splits)
            except ImportError:
                log.warning("fasttext is not installed (pip install -e '.[bench]'); skipping it")
        if not args.peers_only:
            threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
            with ThreadPoolExecutor(args.jobs) as pool:
                run = partial(train_run, config, out=args.out, extra=args.extra, threads=threads)
                runs = list(pool.map(run, args.seeds))
            row["this_model_runs"] = runs
            row["this_model"] = statistics.median(r["best_val_acc"] for r in runs)

    print("\n| dataset | model | validation accuracy | train time (s) |\n|---|---|---|---|")
    for name, row in results.items():
        if "this_model" in row:
            accs = ", ".join(f"{r['best_val_acc']:.4f}" for r in row["this_model_runs"])
            times = statistics.median(r["seconds"] for r in row["this_model_runs"])
            print(f"| {name} | this model (median of {len(row['this_model_runs'])} seeds: {accs}) | "
                  f"**{row['this_model']:.4f}** | {times:.0f} |")
        peers = (("tfidf_logreg", "TF-IDF + logistic regression"), ("nb_logreg", "NB-LR"), ("fasttext", "fastText"))
        for peer, label in peers:
            if peer in row:
                print(f"| {name} | {label} | {row[peer]:.4f} | |")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
