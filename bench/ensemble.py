"""Where a model's validation errors lie: score checkpoints on a config's validation split, one by one and with
their class probabilities averaged, and count the texts that every checkpoint gets wrong. Errors that all runs
share are ones averaging cannot fix; reading them (--show) tells label noise from a model's blind spots.

    python -m bench.ensemble --config configs/chnsenticorp_htl.yaml \\
        runs/accuracy/chnsenticorp_htl-seed*/lightning_logs/version_0/checkpoints/best-*.ckpt
    python -m bench.ensemble --config configs/chnsenticorp_htl.yaml CKPT ... --nb-lr --show 20

The checkpoints may differ in anything (tokenizer, size, seed); each encodes the raw validation texts with its
own tokenizer. The validation split is the one the config's `data:` section makes (the same one train.py
validates on). The last line of stdout is a JSON object with every figure.
"""

import argparse
import json
from pathlib import Path

import numpy as np


from bench.accuracy import nb_logreg_probabilities, splits_for
from data.sources import DataError
from data.checkpoint import CheckpointError
from inference import TextClassifier


def checkpoint_probabilities(path: Path, texts: list[str], label_names: list[str]) -> np.ndarray:
    """(N, num_classes) probabilities, columns in the split's label order."""
    classifier = TextClassifier.from_checkpoint(path, device="cpu")
    if sorted(classifier.label_names) != sorted(label_names):
        raise SystemExit(f"error: {path}: labels {classifier.label_names} differ from the split's {label_names}")
    predictions = classifier.predict(texts)
    return np.array([[p.probabilities[name] for name in label_names] for p in predictions])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+", type=Path, help="checkpoints written by train.py")
    parser.add_argument("--config", required=True, help="YAML config whose data: section makes the validation split")
    parser.add_argument("--nb-lr", action="store_true", help="also score NB-LR and its average with the checkpoints")
    parser.add_argument("--show", type=int, default=0, metavar="N", help="print N texts every checkpoint gets wrong")
    parser.add_argument("--split", default="validation", choices=("validation", "test"),
                        help="the split to score (default: validation; test only once everything is chosen)")
    args = parser.parse_args(argv)

    config = Path(args.config).resolve()  # relative to where you stand, not to the repository
    if not config.is_file():
        raise SystemExit(f"error: {args.config}: config file not found")
    try:
        splits = splits_for(str(config))
    except DataError as e:
        raise SystemExit(f"error: {e}") from None
    if args.split not in splits.texts:
        raise SystemExit(f"error: {args.config}: the data have no {args.split} split")
    texts, labels, names = splits.texts[args.split], np.array(splits.labels[args.split]), splits.label_names
    if not texts:
        raise SystemExit(f"error: {args.config}: the {args.split} split is empty")
    if args.nb_lr and len(names) != 2:
        raise SystemExit(f"error: {args.config}: --nb-lr is for two classes, the data has {len(names)}")
    rows, probabilities = [], []
    for path in args.checkpoints:
        try:
            p = checkpoint_probabilities(path, texts, names)
        except CheckpointError as e:
            raise SystemExit(f"error: {e}") from None
        probabilities.append(p)
        rows.append((str(path), float((p.argmax(1) == labels).mean())))
    average = np.mean(probabilities, axis=0)
    rows.append((f"average of {len(probabilities)}", float((average.argmax(1) == labels).mean())))
    if args.nb_lr:
        nb = nb_logreg_probabilities(splits, args.split)
        rows.append(("NB-LR", float((nb.argmax(1) == labels).mean())))
        rows.append((f"average of {len(probabilities)}, then averaged with NB-LR",
                     float(((average + nb).argmax(1) == labels).mean())))

    wrong = np.stack([p.argmax(1) != labels for p in probabilities])  # (checkpoints, N)
    wrong_in_all = np.flatnonzero(wrong.all(0))
    summary = {
        f"{args.split}_texts": len(texts),
        "accuracy": dict(rows),
        "wrong_in_every_checkpoint": len(wrong_in_all),
        "wrong_in_at_least_half": int((wrong.mean(0) >= 0.5).sum()),
        "right_in_every_checkpoint": int((~wrong).all(0).sum()),
    }
    print(f"| model | {args.split} accuracy |\n|---|---|")
    for name, accuracy in rows:
        print(f"| {name} | {accuracy:.4f} |")
    print(f"\n{len(texts)} {args.split} texts: {summary['right_in_every_checkpoint']} right in every checkpoint, "
          f"{summary['wrong_in_at_least_half']} wrong in at least half, {len(wrong_in_all)} wrong in every one.")
    for i in wrong_in_all[: args.show]:
        predicted = names[int(average[i].argmax())]
        print(f"  label {names[labels[i]]!r}, predicted {predicted!r}: {' '.join(texts[i].split())[:150]}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
