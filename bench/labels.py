"""Labels as users have them, measured: several labels a text (GoEmotions), a rare class (SST-2 with 95% of its
positives dropped) and calibration (SST-2), this model beside TF-IDF + logistic regression, all scored here.

    python -m bench.labels files --out runs/labels              # writes the imbalanced SST-2 files
    python -m bench.labels peers --out runs/labels              # the TF-IDF rows (a few minutes)
    python -m bench.labels score --out runs/labels --run goemotions=RUN --run sst2_imbalanced=RUN --run sst2=RUN

The model's runs (train.py, no config; `make`-free commands in docs/LABELS.md):
    goemotions        python train.py fit --data.dataset goemotions
    sst2_imbalanced   python train.py fit --data.train_file runs/labels/sst2_imbalanced_train.tsv \
                          --data.val_file $ATTENTION_DATA_ROOT/sst2/validation.tsv --data.text_column sentence
    sst2              python train.py fit --data.train_file $ATTENTION_DATA_ROOT/sst2/train.tsv \
                          --data.val_file runs/labels/sst2_calibration.tsv \
                          --data.test_file runs/labels/sst2_report.tsv --data.text_column sentence
                      (calibrated on one half of SST-2's validation split, reported on the other: write_sst2_halves)

Splits: GoEmotions reports test, thresholds (this model's and the tuned peer's) chosen on validation only.
Imbalanced SST-2 is trained on train less 95% of its positives (seed 0), validated and reported on the whole
validation split (nothing is tuned on it beyond checkpoint selection, as for every SST-2 figure here).
A run's figure is its best checkpoint (RUN: a run folder) read by the Python API (TextClassifier), so the stored
thresholds and temperature are the ones applied.
"""

import argparse
import json
import random
from pathlib import Path

import numpy as np

from bench.common import best_checkpoint, fit_ngram_teacher
from data.sources import load_splits, local_copy_dir

DROPPED_SHARE, DROP_SEED = 0.95, 0


def goemotions():
    return load_splits(dataset="goemotions", data_dir=None, train_file=None, val_file=None, test_file=None,
                       text_column=None, label_column=None, val_fraction=0.1, seed=0)


def write_imbalanced_sst2(out: Path) -> Path:
    """train.tsv of SST-2 less 95% of its positives (seed 0): 29,780 negatives, 1,878 positives."""
    folder = local_copy_dir("sst2", None)
    lines = (folder / "train.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    rng = random.Random(DROP_SEED)
    kept = [row for row in rows if not row.endswith("\t1") or rng.random() >= DROPPED_SHARE]
    out.mkdir(parents=True, exist_ok=True)
    path = out / "sst2_imbalanced_train.tsv"
    path.write_text("\n".join([header, *kept]) + "\n", encoding="utf-8")
    return path


def write_sst2_halves(out: Path) -> tuple[Path, Path]:
    """SST-2's validation split cut in two halves, stratified (seed 0): calibration (the run's validation: early
    stopping, checkpoint and temperature) and report (its test). Sentences like the report's: training phrases
    are shorter and surer, so a temperature fitted on them would not carry over."""
    from data.sources import stratified_split

    lines = (local_copy_dir("sst2", None) / "validation.tsv").read_text(encoding="utf-8").splitlines()
    header, rows = lines[0], lines[1:]
    calibrate, report = stratified_split([row.rsplit("\t", 1)[1] for row in rows], 0.5, DROP_SEED)
    paths = out / "sst2_calibration.tsv", out / "sst2_report.tsv"
    for path, part in zip(paths, (calibrate, report)):
        path.write_text("\n".join([header, *(rows[i] for i in part)]) + "\n", encoding="utf-8")
    return paths


def imbalanced_sst2(out: Path):
    folder = local_copy_dir("sst2", None)
    return load_splits(dataset="sst2", data_dir=None, train_file=str(out / "sst2_imbalanced_train.tsv"),
                       val_file=str(folder / "validation.tsv"), test_file=None, text_column="sentence",
                       label_column="label", val_fraction=0.1, seed=0)


def multi_hot(sets, n):
    y = np.zeros((len(sets), n), dtype=np.int64)
    for row, indices in enumerate(sets):
        y[row, indices] = 1
    return y


def f1s(predicted, truth) -> dict:
    from sklearn.metrics import f1_score

    return {"macro_f1": float(f1_score(truth, predicted, average="macro", zero_division=0)),
            "micro_f1": float(f1_score(truth, predicted, average="micro", zero_division=0))}


def tuned_thresholds(probabilities, truth) -> np.ndarray:
    """Per label the cut of training/calibration.py's grid with the best validation F1."""
    from training.calibration import fit_thresholds

    import torch

    return np.asarray(fit_thresholds(torch.from_numpy(probabilities), torch.from_numpy(truth)))


def goemotions_peers() -> dict:
    """TF-IDF word 1-2-grams + one-vs-rest logistic regression (C 4): cuts at 0.5, cuts tuned per label on
    validation, and class_weight balanced with cuts at 0.5."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier

    from data.teacher import ngram_features

    splits = goemotions()
    n = len(splits.label_names)
    y = {split: multi_hot(sets, n) for split, sets in splits.labels.items()}
    vectorizer = ngram_features(splits.texts["train"])
    x = {split: (vectorizer.fit_transform(texts) if split == "train" else None) for split, texts in splits.texts.items()}
    for split in ("validation", "test"):
        x[split] = vectorizer.transform(splits.texts[split])
    rows = {}
    for weighting in (None, "balanced"):
        model = OneVsRestClassifier(LogisticRegression(C=4.0, max_iter=2000, class_weight=weighting), n_jobs=1)
        model.fit(x["train"], y["train"])
        p = {split: model.predict_proba(x[split]) for split in ("validation", "test")}
        name = "TF-IDF + LR" + (" balanced" if weighting else "")
        rows[f"{name}, cuts 0.5"] = f1s((p["test"] >= 0.5).astype(int), y["test"])
        cuts = tuned_thresholds(p["validation"], y["validation"])
        rows[f"{name}, cuts tuned on validation"] = f1s((p["test"] >= cuts).astype(int), y["test"])
    return rows


def imbalanced_peers(out: Path) -> dict:
    from sklearn.metrics import f1_score

    splits = imbalanced_sst2(out)
    rows = {}
    for weighting in (None, "balanced"):
        vectorizer, model = fit_ngram_teacher(splits.texts["train"], splits.labels["train"])
        if weighting:
            from sklearn.linear_model import LogisticRegression

            model = LogisticRegression(C=4.0, max_iter=2000, class_weight="balanced").fit(
                vectorizer.transform(splits.texts["train"]), splits.labels["train"])
        predicted = model.predict(vectorizer.transform(splits.texts["validation"]))
        truth = splits.labels["validation"]
        rows["TF-IDF + LR" + (" class_weight=balanced" if weighting else "")] = {
            "macro_f1": float(f1_score(truth, predicted, average="macro")),
            "accuracy": float((np.asarray(predicted) == np.asarray(truth)).mean())}
    return rows


def score_run(name: str, run: str, out: Path) -> dict:
    """The best checkpoint of `run`, through TextClassifier (stored thresholds and temperature applied)."""
    import torch

    from inference import TextClassifier
    from training.calibration import expected_calibration_error

    checkpoint = best_checkpoint(run)
    classifier = TextClassifier.from_checkpoint(checkpoint, device="cpu")
    if name == "goemotions":
        splits, split = goemotions(), "test"
    elif name == "sst2_imbalanced":
        splits, split = imbalanced_sst2(out), "validation"
    else:
        splits = load_splits(dataset="sst2", data_dir=None, train_file=str(out / "sst2_calibration.tsv"),
                             val_file=str(out / "sst2_report.tsv"), test_file=None, text_column="sentence",
                             label_column="label", val_fraction=0.1, seed=0)
        split = "validation"  # the report half
    predictions = classifier.predict(splits.texts[split])
    probabilities = torch.tensor([list(p.probabilities.values()) for p in predictions])
    names = classifier.label_names
    if classifier.multi_label:
        truth = multi_hot(splits.labels[split], len(names))
        predicted = np.array([[int(label in p.labels) for label in names] for p in predictions])
        row = f1s(predicted, truth)
        row["ece"] = expected_calibration_error(probabilities, torch.from_numpy(truth), True)
    else:
        from sklearn.metrics import f1_score

        truth = [splits.label_names[c] for c in splits.labels[split]]
        predicted = [p.label for p in predictions]
        row = {"macro_f1": float(f1_score(truth, predicted, average="macro")),
               "accuracy": float(np.mean([a == b for a, b in zip(truth, predicted)]))}
        index = torch.tensor([names.index(label) for label in truth])
        row["ece"] = expected_calibration_error(probabilities, index, False)
        uncalibrated = (probabilities.log() * classifier.temperature).softmax(-1)  # the logits' own softmax
        row["ece_before_temperature"] = expected_calibration_error(uncalibrated, index, False)
        row["temperature"] = classifier.temperature
    row["checkpoint"] = str(checkpoint)
    return row


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.labels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["files", "peers", "score"])
    parser.add_argument("--out", default="runs/labels", type=Path)
    parser.add_argument("--run", action="append", default=[], metavar="NAME=RUN_FOLDER")
    args = parser.parse_args(argv)
    if args.what == "files":
        print(write_imbalanced_sst2(args.out), *write_sst2_halves(args.out))
        return
    if args.what == "peers":
        if not (args.out / "sst2_imbalanced_train.tsv").exists():
            write_imbalanced_sst2(args.out)
        results = {"sst2_imbalanced (validation)": imbalanced_peers(args.out)}
        show(results)  # the quick rows first: GoEmotions' one-vs-rest fits take minutes
        results["goemotions (test)"] = goemotions_peers()
    else:
        results = {}
        for item in args.run:
            name, run = item.split("=", 1)
            results[f"{name}: this model, no config"] = score_run(name, run, args.out)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.what}.json").write_text(json.dumps(results, indent=2) + "\n")
    show(results)


def show(results: dict) -> None:
    for group, rows in results.items():
        print(group)
        for name, row in (rows.items() if all(isinstance(v, dict) for v in rows.values()) else [("", rows)]):
            figures = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
            print(f"  {name:45s} {figures}", flush=True)


if __name__ == "__main__":
    main()
