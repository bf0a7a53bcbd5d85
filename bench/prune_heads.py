"""Which heads matter, and a checkpoint without the ones that do not (inference/heads.py).

    python -m bench.prune_heads --ckpt CKPT                       # importance, ablation and the table
    python -m bench.prune_heads --ckpt CKPT --prune 3 --out pruned.ckpt
    python predict.py --ckpt pruned.ckpt "the acting is wonderful"

Importance (Michel et al. 2019: mean |∂ loss / ∂ gate| per head) is measured on `--importance-limit` texts drawn
from `--importance-split` (default: 2,000 training texts, so the split the table is scored on is not used to choose
the heads); exact ablation (one head's gate at 0) and the table (accuracy with the N least important heads cut
out, for every N that leaves each layer a head) on `--split` (default validation). The splits are the ones the
checkpoint was trained with. A markdown table goes to stderr; the last line of stdout is a JSON object.
"""

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import torch


from bench.faithfulness import checkpoint_split
from data.files import WriteError, check_target, write_atomically
from inference import CheckpointError, TextClassifier
from inference.classifier import read_checkpoint
from inference.explain import spearman
from inference.heads import accuracy, batches, head_importance, least_important, prune_checkpoint


def labelled(classifier, path, split: str, limit: int | None, seed: int | None = None):
    """Batches of `split` with labels in the classifier's label order; a random sample of `limit` when seed."""
    texts, labels, names = checkpoint_split(path, split)
    if sorted(names) != sorted(classifier.label_names):
        raise SystemExit(f"error: {path}: the split's labels {names} differ from the checkpoint's "
                         f"{classifier.label_names}")
    index = {name: classifier.label_names.index(name) for name in names}
    rows = [(t, index[names[y]]) for t, y in zip(texts, labels) if t.strip()]
    if limit is not None and seed is not None:
        rows = random.Random(seed).sample(rows, min(limit, len(rows)))
    rows = rows[:limit]
    return batches(classifier, [t for t, _ in rows], [y for _, y in rows])


def pruned_classifier(classifier, checkpoint: dict) -> TextClassifier:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "pruned.ckpt"
        torch.save(checkpoint, path)
        return TextClassifier.from_checkpoint(path, device=classifier.device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="checkpoint written by train.py (or by this script)")
    parser.add_argument("--importance-split", default="train")
    parser.add_argument("--importance-limit", type=int, default=2000, metavar="N")
    parser.add_argument("--split", default="validation", help="split for ablation and the table")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="first N texts of --split only")
    parser.add_argument("--prune", type=int, metavar="N", help="cut the N least important heads ...")
    parser.add_argument("--out", help="... and write the pruned checkpoint here")
    parser.add_argument("--no-table", action="store_true", help="skip the accuracy-against-heads-kept table")
    args = parser.parse_args(argv)
    if (args.prune is None) != (args.out is None):
        parser.error("--prune and --out go together")
    # Every input checked before the computation (minutes on a real split): the target, the checkpoint's layout.
    try:
        if args.out is not None:
            check_target(args.out, "pruned checkpoint", inputs=[args.ckpt])
        checkpoint = read_checkpoint(args.ckpt)
        classifier = TextClassifier.from_checkpoint(args.ckpt, device="cpu")
    except (CheckpointError, ValueError) as e:  # WriteError is a ValueError
        raise SystemExit(f"error: {e}") from None
    model = classifier.model
    importance_data = labelled(classifier, args.ckpt, args.importance_split, args.importance_limit, seed=0)
    data = labelled(classifier, args.ckpt, args.split, args.limit)
    importance = head_importance(model, importance_data)
    if args.prune is not None:
        try:
            least_important(importance, args.prune)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
    base = accuracy(model, data)
    heads = []
    for layer, values in enumerate(importance):
        for head, value in enumerate(values):
            ablated = accuracy(model, data, removed=(layer, head))
            heads.append({"layer": layer, "head": head, "importance": round(float(value), 6),
                          "ablation_accuracy": round(ablated, 4), "ablation_drop": round(base - ablated, 4)})
    print("| layer | head | importance (Michel) | accuracy without it | drop |\n|--:|--:|--:|--:|--:|", file=sys.stderr)
    for h in heads:
        print(f"| {h['layer']} | {h['head']} | {h['importance']:.4f} | {h['ablation_accuracy']:.4f} | "
              f"{h['ablation_drop']:+.4f} |", file=sys.stderr)
    agreement = spearman([h["importance"] for h in heads], [h["ablation_drop"] for h in heads])
    print(f"\nSpearman of importance with the ablation drop over the {len(heads)} heads: {agreement}", file=sys.stderr)
    total = sum(len(t) for t in importance)
    table = []
    if not args.no_table:
        for n in range(total - len(importance) + 1):
            removed = least_important(importance, n)
            pruned = pruned_classifier(classifier, prune_checkpoint(checkpoint, removed))
            table.append({"heads_kept": total - n, "removed": [list(p) for p in removed],
                          "accuracy": round(accuracy(pruned.model, data), 4)})
        print("\n| heads kept | removed (layer, head) | accuracy |\n|--:|:--|--:|", file=sys.stderr)
        for row in table:
            removed = " ".join(f"({a},{b})" for a, b in row["removed"]) or "—"
            print(f"| {row['heads_kept']} | {removed} | {row['accuracy']:.4f} |", file=sys.stderr)
    result = {"checkpoint": str(args.ckpt), "split": args.split, "texts": sum(len(b[2]) for b in data),
              "importance_split": args.importance_split, "importance_texts": sum(len(b[2]) for b in importance_data),
              "accuracy": round(base, 4), "heads": heads, "importance_vs_ablation_spearman": agreement,
              "table": table}
    if args.prune is not None:
        removed = least_important(importance, args.prune)
        try:
            pruned = prune_checkpoint(checkpoint, removed)
        except ValueError as e:
            raise SystemExit(f"error: {args.ckpt}: {e}") from None
        try:
            write_atomically(args.out, lambda path: torch.save(pruned, path), "pruned checkpoint", inputs=[args.ckpt])
        except WriteError as e:
            raise SystemExit(f"error: {e}") from None
        result["pruned"] = {"out": args.out, "removed": [list(p) for p in removed],
                            "layer_heads": pruned["hyper_parameters"]["network"]["layer_heads"],
                            "accuracy": round(accuracy(pruned_classifier(classifier, pruned).model, data), 4)}
        print(f"\nwrote {args.out}: removed {removed}, accuracy {result['pruned']['accuracy']:.4f}", file=sys.stderr)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
