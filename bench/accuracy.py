"""Accuracy of this model against TF-IDF + logistic regression, NB-LR (naive-Bayes weighted n-grams, Wang & Manning
2012) and fastText, on every registered dataset with a local copy, in one table. The README's results come from it.

    python -m bench.accuracy --jobs 2                          # every dataset: generic default and tuned, 3 seeds
    python -m bench.accuracy --datasets sst2 --configs default --seeds 0
    python -m bench.accuracy --peers-only                      # the peers alone, a minute or two
    python -m bench.accuracy --reuse --out runs/accuracy       # the table from runs already there (no training)

Model configurations: `default` is configs/default.yaml with only `--data.dataset` added (no tuning for the
dataset: sizes and training length are chosen from its training split); `tuned` is the dataset's own config.

Reported split: **test** where the dataset has a labelled one (ChnSentiCorp's fixed 10% split, IMDB's official
test set), else validation (SST-2). Runs, settings and checkpoints are chosen on validation only: a run's figure is
its best-validation checkpoint (the one train.py keeps) scored by `train.py test`; beside it, the best and the
last epoch's validation accuracy. `ensemble` averages the probabilities of the seeds' best checkpoints
(inference/ensemble.py, as `predict.py --ckpt a --ckpt b ...`). Peers are fitted on the training split only.
Training time is config.yaml → the last validation epoch of each run (the fit itself, without data loading).

Attention earns its place (--ablation): each configuration is also trained with attention's choice taken away, every
query weighing all tokens of its text the same (`--model.network.scale 1e-6`: the scores vanish, softmax is uniform,
attention becomes mean pooling of the values), on the same seeds; its row sits beside the full model's.

Needs the `bench` extra for the peers: pip install -e ".[bench]".
"""

import argparse
import json
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import yaml

from bench.common import ROOT, fit_ngram_teacher, is_cjk
from data.sources import DATA_ROOT_ENV, load_splits, local_copy_dir

DEFAULT_CONFIG = "configs/default.yaml"
# Attention replaced by mean pooling: scores multiplied by 1e-6 are ~0 for any query and key, so softmax weighs every
# real token of the text the same (the padding mask still applies).
UNIFORM_ATTENTION = ["--model.network.scale", "1e-6"]
ABLATED = "-uniform"
TUNED = {"sst2": "configs/sst2.yaml", "chnsenticorp_htl": "configs/chnsenticorp_htl.yaml", "imdb": "configs/imdb.yaml"}
log = logging.getLogger("bench.accuracy")


def config_files(dataset: str, which: str) -> list[str]:
    return [DEFAULT_CONFIG] if which.removesuffix(ABLATED) == "default" else [TUNED[dataset]]


def splits_for(config: str, dataset: str | None = None):
    """The splits a config's `data:` section makes (train.py makes the same), optionally for another dataset."""
    data = (yaml.safe_load((ROOT / config).read_text()) or {}).get("data", {})
    return load_splits(
        dataset=dataset or data.get("dataset", "sst2"), data_dir=data.get("data_dir"),
        train_file=data.get("train_file"), val_file=data.get("val_file"), test_file=data.get("test_file"),
        text_column=data.get("text_column"), label_column=data.get("label_column"),
        val_fraction=data.get("val_fraction", 0.1), seed=data.get("seed", 0),
    )


def report_split(splits) -> str:
    return "test" if "test" in splits.texts else "validation"


def accuracy(predicted, labels) -> float:
    return float((np.asarray(predicted) == np.asarray(labels)).mean())


def tfidf_logreg(splits, split: str = "validation") -> float:
    """The n-gram teacher (training/ngram_teacher.py) fitted on the whole training split: TF-IDF character 1-3-grams for
    Chinese, word 1-2-grams (words of one letter or more) otherwise, then logistic regression."""
    vectorizer, classifier = fit_ngram_teacher(splits.texts["train"], splits.labels["train"])
    return accuracy(classifier.predict(vectorizer.transform(splits.texts[split])), splits.labels[split])


def nb_logreg(splits, split: str = "validation") -> float:
    return accuracy(nb_logreg_probabilities(splits, split).argmax(1), splits.labels[split])


def nb_logreg_probabilities(splits, split: str = "validation") -> np.ndarray:
    """Binary n-gram features scaled by their naive-Bayes log-count ratio, then logistic regression (NBSVM's
    logistic cousin): among the strongest bag-of-n-grams sentiment classifiers. Returns its class probabilities
    for the texts of `split`, (N, 2), columns in label id order."""
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    chinese = is_cjk(splits.texts["train"])
    vectorizer = CountVectorizer(analyzer="char" if chinese else "word", ngram_range=(1, 2), binary=True,
                                 token_pattern=None if chinese else r"\S+")
    x_train, y_train = vectorizer.fit_transform(splits.texts["train"]), np.array(splits.labels["train"])
    if set(y_train) != {0, 1}:
        raise ValueError("NB-LR is for two classes")
    positive = np.asarray(x_train[y_train == 1].sum(0)).ravel() + 1  # add-one smoothed feature counts per class
    negative = np.asarray(x_train[y_train == 0].sum(0)).ravel() + 1
    ratio = np.log((positive / positive.sum()) / (negative / negative.sum()))
    classifier = LogisticRegression(C=1.0, max_iter=3000).fit(x_train.multiply(ratio).tocsr(), y_train)
    return classifier.predict_proba(vectorizer.transform(splits.texts[split]).multiply(ratio).tocsr())


def fasttext_accuracy(splits, split: str = "validation") -> float:
    import fasttext

    chinese = is_cjk(splits.texts["train"])

    def line(text):
        text = " ".join(text) if chinese else text  # characters as words for Chinese
        return " ".join(text.lower().split())

    # fastText reads its file in order: rows sorted by label (IMDB's negatives, then positives) would end its
    # training on one class (56% on IMDB's test set). Shuffled, with a fixed seed.
    rows = list(zip(splits.texts["train"], splits.labels["train"]))
    random.Random(0).shuffle(rows)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False, encoding="utf-8") as f:
        for text, label in rows:
            f.write(f"__label__{label} {line(text)}\n")
    try:
        model = fasttext.train_supervised(f.name, epoch=25, wordNgrams=2, dim=100, lr=0.1, thread=1, seed=0, verbose=0)
    finally:
        os.unlink(f.name)
    predicted = [int(model.predict(line(t))[0][0].removeprefix("__label__")) for t in splits.texts[split]]
    return accuracy(predicted, splits.labels[split])


def run_dir(out: Path, dataset: str, which: str, seed: int) -> Path:
    return out / f"{dataset}-{which}-seed{seed}"


def newest_run(save_dir: Path) -> Path | None:
    runs = [p.parent.parent for p in save_dir.glob("lightning_logs/version_*/checkpoints/last.ckpt")]
    return max(runs, key=lambda p: (p / "checkpoints" / "last.ckpt").stat().st_mtime) if runs else None


def train_run(dataset: str, which: str, seed: int, out: Path, extra: list[str], threads: int | None) -> Path:
    """One `train.py fit` run (skipped with --reuse when its folder holds a finished one); returns the run folder."""
    save_dir = run_dir(out, dataset, which, seed)
    configs = [arg for config in config_files(dataset, which) for arg in ("--config", str(ROOT / config))]
    command = [sys.executable, str(ROOT / "train.py"), "fit", *configs, "--data.dataset", dataset,
               "--seed_everything", str(seed), "--trainer.logger.init_args.save_dir", str(save_dir),
               "--trainer.enable_progress_bar", "false", *(UNIFORM_ATTENTION if which.endswith(ABLATED) else []),
               *extra]
    log.info("running %s", " ".join(command))
    env = {**os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {})}
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        raise SystemExit(f"training failed ({dataset}, {which}, seed {seed}):\n{result.stderr[-3000:]}")
    return newest_run(save_dir)


def validation_curve(run: Path) -> tuple[list[float], float]:
    """val/acc of every epoch, from the run's TensorBoard events, and when the last one was logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run), size_guidance={"scalars": 0})
    events.Reload()
    scalars = sorted(events.Scalars("val/acc"), key=lambda e: e.step)
    return [event.value for event in scalars], scalars[-1].wall_time


def score_run(run: Path, split: str) -> dict:
    """Best and last validation accuracy, epochs, fit time, and the best checkpoint scored by `train.py test`
    (validation when the data has no test split)."""
    from data.checkpoint import resolve_checkpoint

    best = resolve_checkpoint(run)
    curve, finished = validation_curve(run)
    seconds = finished - (run / "config.yaml").stat().st_mtime  # the fit: start → last validation epoch
    stage = "test" if split == "test" else "validate"
    args = [stage, "--config", str(run / "config.yaml"), "--ckpt_path", str(best), "--trainer.logger", "false",
            "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", str(run / "scoring")]
    code = (f"import json, train; cli = train.main({args!r}); "
            "print('RESULT', json.dumps({k: float(v) for k, v in cli.trainer.callback_metrics.items()}))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        raise SystemExit(f"scoring {best} failed:\n{result.stderr[-3000:]}")
    metrics = json.loads(lines[-1].removeprefix("RESULT "))
    key = "test/acc" if split == "test" else "val/acc"
    return {"run": str(run), "checkpoint": str(best), "accuracy": metrics[key], "best_val": max(curve),
            "last_val": curve[-1], "epochs": len(curve), "best_epoch": curve.index(max(curve)),
            "minutes": round(seconds / 60, 1)}


def ensemble_accuracy(checkpoints: list[str], splits, split: str) -> float:
    from inference.ensemble import Ensemble

    ensemble = Ensemble.from_checkpoints(checkpoints, device="cpu")
    predicted = [ensemble.label_names.index(p.label) for p in ensemble.predict(splits.texts[split])]
    names = splits.label_names
    return accuracy(predicted, [ensemble.label_names.index(names[y]) for y in splits.labels[split]])


def has_local_copy(dataset: str) -> bool:
    return local_copy_dir(dataset, None) is not None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(TUNED), choices=list(TUNED),
                        help="those with a local copy ($%s/<name>) are run (%%(default)s)" % DATA_ROOT_ENV)
    parser.add_argument("--configs", nargs="+", default=["default", "tuned"], choices=["default", "tuned"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds for this model (%(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "accuracy", help="where runs are written (%(default)s)")
    parser.add_argument("--jobs", type=int, default=1,
                        help="training runs at once; with 2 on a 2-core machine each gets one thread (%(default)s)")
    parser.add_argument("--ablation", action="store_true",
                        help="also each configuration with attention replaced by mean pooling (uniform weights)")
    parser.add_argument("--reuse", action="store_true", help="score runs already in --out instead of training them")
    parser.add_argument("--peers-only", action="store_true", help="only the peers: TF-IDF + LR, NB-LR, fastText")
    parser.add_argument("--model-only", action="store_true", help="only this model")
    parser.add_argument("extra", nargs="*", help="extra train.py arguments after --, e.g. -- --trainer.max_epochs 1")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    datasets = [name for name in args.datasets if has_local_copy(name)]
    for name in set(args.datasets) - set(datasets):
        log.warning("%s: no local copy ($%s/%s); skipped", name, DATA_ROOT_ENV, name)
    results = {}
    for name in datasets:
        splits = splits_for(DEFAULT_CONFIG, name)
        split = report_split(splits)
        row = results[name] = {"split": split, "texts": len(splits.texts[split])}
        if not args.model_only:
            for peer, score in (("tfidf_logreg", tfidf_logreg), ("nb_logreg", nb_logreg), ("fasttext", fasttext_accuracy)):
                start = time.perf_counter()
                try:
                    row[peer] = {"accuracy": score(splits, split), "minutes": round((time.perf_counter() - start) / 60, 1)}
                except ImportError:
                    log.warning("fasttext is not installed (pip install -e '.[bench]'); skipping it")
                except ValueError as e:  # NB-LR on more than two classes
                    log.warning("%s on %s: %s", peer, name, e)
        if args.peers_only:
            continue
        for which in [w + suffix for w in args.configs for suffix in ("", ABLATED)[: 1 + args.ablation]]:
            if which.startswith("tuned") and not (ROOT / TUNED[name]).is_file():
                continue
            if args.reuse:
                runs = [newest_run(run_dir(args.out, name, which, seed)) for seed in args.seeds]
                runs = [run for run in runs if run is not None]
            else:
                threads = max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None
                with ThreadPoolExecutor(args.jobs) as pool:
                    runs = list(pool.map(lambda s: train_run(name, which, s, args.out, args.extra, threads), args.seeds))
            if not runs:
                continue
            scored = [score_run(run, split) for run in runs]
            row[which] = {
                "runs": scored, "accuracy": statistics.median(r["accuracy"] for r in scored),
                "ensemble": ensemble_accuracy([r["checkpoint"] for r in scored], splits, split) if len(scored) > 1 else None,
            }
    print_table(results)
    print(json.dumps(results))


def print_table(results: dict) -> None:
    print("\n| dataset (reported split) | model | accuracy | best / last validation epoch (median) | "
          "minutes per run | epochs |\n|---|---|---|---|---|---|")
    names = {"tfidf_logreg": "TF-IDF + logistic regression", "nb_logreg": "NB-LR", "fasttext": "fastText"}
    for dataset, row in results.items():
        where = f"{dataset} ({row['split']}, {row['texts']})"
        for which in ("default", "default" + ABLATED, "tuned", "tuned" + ABLATED):
            if which not in row:
                continue
            runs = row[which]["runs"]
            seeds = ", ".join(f"{100 * r['accuracy']:.2f}" for r in runs)
            best = statistics.median(r["best_val"] for r in runs)
            last = statistics.median(r["last_val"] for r in runs)
            minutes = statistics.median(r["minutes"] for r in runs)
            epochs = ", ".join(f"{r['best_epoch'] + 1}/{r['epochs']}" for r in runs)
            label = "generic default" if which.startswith("default") else "tuned config"
            if which.endswith(ABLATED):
                label += ", attention replaced by mean pooling"
            print(f"| {where} | this model, {label}, median of {len(runs)} ({seeds}) | **{100 * row[which]['accuracy']:.2f}** "
                  f"| {100 * best:.2f} / {100 * last:.2f} | {minutes:.1f} | best/trained {epochs} |")
            if row[which]["ensemble"] is not None:
                print(f"| {where} | this model, {label}, ensemble of the {len(runs)} | "
                      f"{100 * row[which]['ensemble']:.2f} | | | |")
        for peer, label in names.items():
            if peer in row:
                print(f"| {where} | {label} | {100 * row[peer]['accuracy']:.2f} | | {row[peer]['minutes']:.1f} | |")


if __name__ == "__main__":
    main()
