"""Labels as users have them, measured: several labels a text (GoEmotions), a rare class (SST-2 with 95% of its
positives dropped) and calibration (SST-2, IMDB), this model beside TF-IDF + logistic regression, all scored here.

    python -m bench.labels files --out runs/labels              # writes the imbalanced SST-2 file
    python -m bench.labels peers --out runs/labels              # the TF-IDF rows (a few minutes)
    python -m bench.labels score --out runs/labels --run goemotions=RUN --run sst2_imbalanced=RUN --run sst2=RUN \
        --run imdb=RUN                                          # each run's row, its peers (peers.json) beneath

The model's runs (train.py, no config; RUN: the run's folder, e.g. lightning_logs/version_0):
    goemotions        python train.py fit --data.dataset goemotions
    sst2_imbalanced   python train.py fit --data.train_file runs/labels/sst2_imbalanced_train.tsv \
                          --data.val_file $ATTENTION_DATA_ROOT/sst2/validation.tsv --data.text_column sentence
    sst2              python train.py fit
    imdb              python train.py fit --data.dataset imdb

Splits: GoEmotions reports test, thresholds (this model's and the tuned peer's) chosen on validation only.
Imbalanced SST-2 is trained on train less 95% of its positives (seed 0), validated and reported on the whole
validation split (nothing is tuned on it beyond checkpoint selection, as for every SST-2 figure here).
Calibration: the temperature a run stores is fitted on its validation split. IMDB reports ECE on its test split
(25,000 reviews, never seen in training). SST-2 has no labelled test split, so its ECE is cross-fitted on its
validation split (872 sentences): cut in two stratified halves (seed 0), each half's probabilities divided by the
temperature fitted on the other half, the ECE taken over all 872 (no text is scored with a temperature fitted on it);
and the mean and range of that figure over HALVINGS halvings (seeds 0-4): one halving alone varies by about ±0.01.
A run's figure is its best checkpoint read by the Python API (TextClassifier), so the stored thresholds and
temperature are the ones applied.
"""

import argparse
import json
import random
from pathlib import Path

import numpy as np

from bench.common import best_checkpoint, fit_ngram_teacher
from data.sources import load_splits, local_copy_dir

DROPPED_SHARE, DROP_SEED = 0.95, 0
HALVINGS = 5  # SST-2: halvings of validation (seeds 0-4) its cross-fitted ECE is also averaged over


def registered(dataset: str):
    return load_splits(dataset=dataset, data_dir=None, train_file=None, val_file=None, test_file=None,
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

    from training.ngram_teacher import ngram_features

    splits = registered("goemotions")
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


SCORED = {"goemotions": "test", "sst2_imbalanced": "validation", "sst2": "validation", "imdb": "test"}
PEERS = {"goemotions": "goemotions (test)", "sst2_imbalanced": "sst2_imbalanced (validation)"}


def score_run(name: str, run: str, out: Path) -> dict:
    """The best checkpoint of `run`, through TextClassifier (stored thresholds and temperature applied)."""
    import torch

    from inference import TextClassifier
    from training.calibration import expected_calibration_error

    if name not in SCORED:
        raise SystemExit(f"--run {name}=...: the name must be one of {', '.join(SCORED)}")
    checkpoint = best_checkpoint(run)
    classifier = TextClassifier.from_checkpoint(checkpoint, device="cuda" if torch.cuda.is_available() else "cpu")
    splits, split = imbalanced_sst2(out) if name == "sst2_imbalanced" else registered(name), SCORED[name]
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
        logits = probabilities.double().clamp(min=1e-300).log() * classifier.temperature  # up to a constant a row
        held_out = split == "test"  # else the split the stored temperature was fitted on
        row["ece" if held_out else "ece_on_the_split_fitted"] = expected_calibration_error(probabilities, index, False)
        row["ece_before_temperature"] = expected_calibration_error(logits.softmax(-1), index, False)
        row["temperature"] = classifier.temperature
        if name == "sst2":
            row["ece_cross_fitted"], temperatures = cross_fitted_ece(logits, index)
            row["temperatures_of_the_halves"] = " / ".join(f"{t:.3f}" for t in temperatures)
            # One halving of 872 texts is a noisy estimate: the mean and range over HALVINGS halvings.
            eces = [cross_fitted_ece(logits, index, seed)[0] for seed in range(HALVINGS)]
            row[f"ece_cross_fitted_mean_of_{HALVINGS}_halvings"] = float(np.mean(eces))
            row["ece_cross_fitted_range"] = f"{min(eces):.4f} - {max(eces):.4f}"
        row["ece_if_calibrated"] = ece_of_a_calibrated_model(probabilities)
    row["checkpoint"] = str(checkpoint)
    return row


def ece_of_a_calibrated_model(probabilities, draws: int = 200, seed: int = 0) -> float:
    """The ECE a perfectly calibrated model with these probabilities would show on this many texts: the mean over
    `draws` label sets drawn from the probabilities themselves. On a few hundred texts it is far from 0 (each bin's
    share right is itself a noisy estimate), which says how small a measured ECE can be told apart from none."""
    import torch

    from training.calibration import expected_calibration_error

    generator = torch.Generator().manual_seed(seed)
    return float(sum(expected_calibration_error(probabilities, torch.multinomial(probabilities, 1, generator=generator)
                                                .squeeze(-1), False) for _ in range(draws)) / draws)


def cross_fitted_ece(logits, labels, seed: int = DROP_SEED) -> tuple[float, list[float]]:
    """ECE of all these texts, each half's (stratified, seed) probabilities calibrated by the temperature fitted on
    the other half; and the two temperatures."""
    import torch

    from data.splitting import stratified_split
    from training.calibration import expected_calibration_error, fit_temperature

    halves = stratified_split(labels.tolist(), 0.5, seed)
    calibrated, temperatures = torch.empty_like(logits), []
    for fitted, applied in (halves, halves[::-1]):
        temperature = fit_temperature(logits[fitted], labels[fitted])
        calibrated[applied] = (logits[applied] / temperature).softmax(-1)
        temperatures.append(temperature)
    return expected_calibration_error(calibrated.float(), labels, False), temperatures


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m bench.labels", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["files", "peers", "score"])
    parser.add_argument("--out", default="runs/labels", type=Path)
    parser.add_argument("--run", action="append", default=[], metavar="NAME=RUN_FOLDER")
    args = parser.parse_args(argv)
    if args.what == "files":
        print(write_imbalanced_sst2(args.out))
        return
    if args.what == "peers":
        if not (args.out / "sst2_imbalanced_train.tsv").exists():
            write_imbalanced_sst2(args.out)
        results = {"sst2_imbalanced (validation)": imbalanced_peers(args.out)}
        show(results)  # the quick rows first: GoEmotions' one-vs-rest fits take minutes
        results["goemotions (test)"] = goemotions_peers()
    else:
        results = {}
        peers = json.loads((args.out / "peers.json").read_text()) if (args.out / "peers.json").exists() else {}
        for item in args.run:
            name, run = item.split("=", 1)
            results[f"{name}: this model, no config"] = score_run(name, run, args.out)
            if PEERS.get(name) in peers:  # beside its peers (python -m bench.labels peers)
                results[f"{name}: peers"] = peers[PEERS[name]]
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.what}.json"
    earlier = json.loads(path.read_text()) if args.what == "score" and path.exists() else {}
    path.write_text(json.dumps(earlier | results, indent=2) + "\n")  # runs scored one at a time add up
    show(results)


def show(results: dict) -> None:
    for group, rows in results.items():
        print(group)
        for name, row in (rows.items() if all(isinstance(v, dict) for v in rows.values()) else [("", rows)]):
            figures = ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items())
            print(f"  {name:45s} {figures}", flush=True)


if __name__ == "__main__":
    main()
