"""The no-config default on imbalanced classes, measured: unweighted against balanced class weights, each run chosen on
validation and scored on a test split by accuracy and macro-F1, beside TF-IDF + logistic regression (plain and
class_weight="balanced"). docs/RESULTS.md "Imbalanced classes: the no-config default" comes from it.

    python -m bench.class_weights --out runs/class_weights                     # both sets, both settings, seeds 0 1
    python -m bench.class_weights --sets ekman --settings unweighted --seeds 2 # one cell

Sets (files written under --out; labels are names, so the runs read them as a user's own files):
    sst2_imbalanced  the shipped imbalanced case (bench/labels.py): SST-2's training split less 95% of its positives,
                     2 classes, ratio 16; validation: 10% of it held out by train.py (stratified, as imbalanced);
                     test: SST-2's validation split (balanced 428 / 444: the classes a user meets may not be the
                     ones trained on).
    ekman            GoEmotions' texts with exactly one label, grouped into Ekman's 6 emotions + neutral (the
                     authors' grouping), 7 classes; the official validation and test splits (same distribution as
                     training); training subsampled to 5,400 texts (seed 0, about the size of the question set of
                     issue 49).
Settings (each a plain `train.py fit --data.train_file ...`, only these flags added):
    balanced    model.class_weights balanced (what `auto` chose on these files before): the loss weighs each class
                the same
    unweighted  --model.class_weights null (what `auto` chooses now): the loss weighs each text the same
Both keep the rest of the default on imbalanced classes: the n-gram teacher balanced with its offsets, checkpoints
chosen on macro-F1 (val/f1).
"""

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from bench.common import ROOT, check_writable, fit_ngram_teacher, whole_number
from data.sources import local_copy_dir

SETTINGS = {"balanced": ["--model.class_weights", "balanced"], "unweighted": ["--model.class_weights", "null"]}
EKMAN = {"anger": ["anger", "annoyance", "disapproval"], "disgust": ["disgust"], "fear": ["fear", "nervousness"],
         "joy": ["joy", "amusement", "approval", "excitement", "gratitude", "love", "optimism", "relief", "pride",
                 "admiration", "desire", "caring"],
         "sadness": ["sadness", "disappointment", "embarrassment", "grief", "remorse"],
         "surprise": ["surprise", "realization", "confusion", "curiosity"], "neutral": ["neutral"]}
EKMAN_TRAIN_TEXTS, SUBSAMPLE_SEED = 5400, 0


def write_sets(out: Path) -> dict:
    """Each set's files: {name: {"train": tsv, "val": tsv or None, "test": tsv}} (columns text, label)."""
    from bench.labels import write_imbalanced_sst2

    sst2 = pd.read_csv(write_imbalanced_sst2(out), sep="\t", quoting=3)
    folder = out / "sets"
    folder.mkdir(parents=True, exist_ok=True)
    names = {"0": "negative", "1": "positive"}
    test = pd.read_csv(local_copy_dir("sst2", None) / "validation.tsv", sep="\t", quoting=3)
    files = {"sst2_imbalanced": {"train": folder / "sst2_imbalanced_train.tsv", "val": None,
                                 "test": folder / "sst2_imbalanced_test.tsv"}}
    for frame, key in ((sst2, "train"), (test, "test")):
        frame = pd.DataFrame({"text": frame["sentence"], "label": frame["label"].astype(str).map(names)})
        frame.to_csv(files["sst2_imbalanced"][key], sep="\t", index=False, quoting=3)
    goemotions = local_copy_dir("goemotions", None)
    emotions = (goemotions / "labels.txt").read_text().split()
    group = {emotion: name for name, members in EKMAN.items() for emotion in members}
    files["ekman"] = {}
    for split in ("train", "validation", "test"):
        frame = pd.read_parquet(goemotions / f"{split}.parquet")
        frame = frame[frame["labels"].map(len) == 1]
        frame = pd.DataFrame({"text": frame["text"].str.replace(r"\s+", " ", regex=True),
                              "label": frame["labels"].map(lambda labels: group[emotions[labels[0]]])})
        if split == "train":
            rows = random.Random(SUBSAMPLE_SEED).sample(range(len(frame)), EKMAN_TRAIN_TEXTS)
            frame = frame.iloc[sorted(rows)]
        key = "val" if split == "validation" else split
        files["ekman"][key] = folder / f"ekman_{split}.tsv"
        frame.to_csv(files["ekman"][key], sep="\t", index=False, quoting=3)
    return files


def read(path: Path) -> tuple[list[str], list[str]]:
    frame = pd.read_csv(path, sep="\t", quoting=3, keep_default_na=False, dtype=str)
    return frame["text"].tolist(), frame["label"].tolist()


def scores(truth: list[str], predicted: list[str]) -> dict:
    from sklearn.metrics import f1_score

    return {"accuracy": float(np.mean(np.array(truth) == np.array(predicted))),
            "macro_f1": float(f1_score(truth, predicted, average="macro"))}


def describe(files: dict) -> dict:
    _, labels = read(files["train"])
    counts = pd.Series(labels).value_counts()
    return {"classes": len(counts), "train_texts": len(labels), "ratio": round(float(counts.max() / counts.min()), 1)}


def peers(files: dict) -> dict:
    """TF-IDF + logistic regression (bench/common.py's recipe) fitted on the training file, scored on the test file."""
    texts, labels = read(files["train"])
    test_texts, truth = read(files["test"])
    rows = {}
    for weight in (None, "balanced"):
        vectorizer, classifier = fit_ngram_teacher(texts, labels, class_weight=weight)
        predicted = classifier.predict(vectorizer.transform(test_texts))
        rows[f"tfidf_lr_{weight or 'plain'}"] = scores(truth, list(predicted))
    return rows


def fit_and_score(files: dict, setting: str, seed: int, out: Path) -> dict:
    """One no-config `train.py fit` on the set's files; its best checkpoint (chosen on validation) scored on test."""
    from bench.common import best_checkpoint
    from inference.classifier import TextClassifier

    save_dir = out / "runs" / f"{files['train'].stem}-{setting}-seed{seed}"
    command = [sys.executable, str(ROOT / "train.py"), "fit", "--data.train_file", str(files["train"]),
               *(["--data.val_file", str(files["val"])] if files["val"] else []),
               "--seed_everything", str(seed), "--trainer.logger.init_args.save_dir", str(save_dir),
               "--trainer.enable_progress_bar", "false", "--data.cache_dir", str(out / "cache"),
               *SETTINGS[setting]]
    print("running", " ".join(command), file=sys.stderr, flush=True)
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"training failed ({files['train'].name}, {setting}, seed {seed}):\n{result.stderr[-3000:]}")
    runs = sorted(save_dir.glob("lightning_logs/version_*"), key=lambda p: p.stat().st_mtime)
    checkpoint = best_checkpoint(runs[-1])
    texts, truth = read(files["test"])
    predicted = [p.label for p in TextClassifier.from_checkpoint(checkpoint, device="cpu").predict(texts)]
    return {"seed": seed, "checkpoint": str(checkpoint), **scores(truth, predicted)}


def print_table(results: dict) -> None:
    print("\n| set (classes, ratio, training texts) | setting | test accuracy | test macro-F1 |\n|---|---|---|---|")
    for name, row in results.items():
        where = f"{name} ({row['classes']}, {row['ratio']}, {row['train_texts']:,})"
        for setting, runs in row["runs"].items():
            accuracy = ", ".join(f"{100 * r['accuracy']:.2f}" for r in runs)
            f1 = ", ".join(f"{r['macro_f1']:.3f}" for r in runs)
            seeds = ", ".join(str(r["seed"]) for r in runs)
            print(f"| {where} | this model, {setting} (seeds {seeds}) | {accuracy} | {f1} |")
        for peer, figures in row["peers"].items():
            print(f"| {where} | {peer} | {100 * figures['accuracy']:.2f} | {figures['macro_f1']:.3f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sets", nargs="+", default=["ekman", "sst2_imbalanced"], choices=["ekman", "sst2_imbalanced"])
    parser.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--seeds", nargs="+", type=whole_number(0), default=[0, 1], help="(%(default)s)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "class_weights", help="(%(default)s)")
    parser.add_argument("--peers-only", action="store_true", help="only the TF-IDF + LR rows")
    args = parser.parse_args(argv)
    check_writable(parser, folders={"--out": args.out})
    files = write_sets(args.out)
    results = {}
    for name in args.sets:
        row = results[name] = {**describe(files[name]), "peers": peers(files[name]), "runs": {}}
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        for seed in [] if args.peers_only else args.seeds:  # seed by seed: each seed's settings side by side
            for setting in args.settings:
                row["runs"].setdefault(setting, []).append(fit_and_score(files[name], setting, seed, args.out))
                (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print_table(results)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
