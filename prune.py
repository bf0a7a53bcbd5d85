"""Which attention heads matter, and a smaller checkpoint without the ones that do not (inference/heads.py).

    python prune.py --ckpt CKPT                                  # importance, ablation and the table
    python prune.py --ckpt CKPT --prune 3 --out pruned.ckpt      # ... and the checkpoint without 3 heads
    python predict.py --ckpt pruned.ckpt "the acting is wonderful"

Importance (Michel et al. 2019: mean |∂ loss / ∂ gate| per head) is measured on `--importance-limit` texts drawn
from `--importance-split` (default: 2,000 training texts, so the split the table is scored on is not used to choose
the heads); exact ablation (one head's gate at 0) and the table (accuracy with the N least important heads cut
out, for every N that leaves each layer a head) on `--split` (default validation). The splits are the ones the
checkpoint was trained with (ATTENTION_DATA_ROOT for the local copy). A markdown table goes to stderr; the last line
of stdout is a JSON object. The pruned checkpoint holds weights only: predict.py and `train.py validate/test`
read it; training cannot resume from it.
"""

import argparse
import contextlib
import json
import sys

import runtime
from inference.faces import add_class_arguments, check_class_arguments
from inference.limits import POSITIVE, Parser


def markdown(heads: list[dict], agreement, table: list[dict]) -> str:
    lines = ["| layer | head | importance (Michel) | accuracy without it | drop |", "|--:|--:|--:|--:|--:|"]
    lines += [f"| {h['layer']} | {h['head']} | {h['importance']:.4f} | {h['ablation_accuracy']:.4f} | "
              f"{h['ablation_drop']:+.4f} |" for h in heads]
    lines.append(f"\nSpearman of importance with the ablation drop over the {len(heads)} heads: {agreement}")
    if table:
        lines += ["\n| heads kept | removed (layer, head) | accuracy |", "|--:|:--|--:|"]
        lines += [f"| {row['heads_kept']} | {' '.join(f'({a},{b})' for a, b in row['removed']) or '—'} | "
                  f"{row['accuracy']:.4f} |" for row in table]
    return "\n".join(lines)


def main(argv=None) -> int:
    args = parse_args(argv)
    runtime.configure()  # before torch loads: runtime.py
    stdout = sys.stdout  # the JSON line; a user's class that prints in its forward goes to stderr
    with contextlib.redirect_stdout(sys.stderr):
        return run(args, stdout)


def parse_args(argv=None) -> argparse.Namespace:
    parser = Parser(prog="prune.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True,
                        help="checkpoint written by train.py (or by this command), or a run folder: its best checkpoint")
    parser.add_argument("--importance-split", default="train")
    parser.add_argument("--importance-limit", type=POSITIVE.argument(), default=2000, metavar="N")
    parser.add_argument("--split", default="validation", help="split for ablation and the table")
    parser.add_argument("--limit", type=POSITIVE.argument(), default=None, metavar="N",
                        help="first N texts of --split only")
    parser.add_argument("--prune", type=POSITIVE.argument(), metavar="N", help="cut the N least important heads ...")
    parser.add_argument("--out", help="... and write the pruned checkpoint here")
    parser.add_argument("--no-table", action="store_true", help="skip the accuracy-against-heads-kept table")
    add_class_arguments(parser)
    args = parser.parse_args(argv)
    check_class_arguments(parser, args)
    if (args.prune is None) != (args.out is None):
        parser.error("--prune and --out go together")
    return args


def check_heads(classifier, path, cut: bool) -> None:
    """The heads can be measured (importance, ablation: they can be told apart in the layer's output) and, with
    --prune, cut (a kind whose weights' layout per head the product knows). ValueError, one line, otherwise."""
    from model.kinds import attention_kind

    config = classifier.model.config
    if cut and not attention_kind(config.attention).heads_cut:
        raise ValueError(f"{path}: --prune: heads of a user's attention class ({config.attention}) cannot be cut "
                         "out of a checkpoint: the product does not know how its weights are laid out per head; "
                         "leave --prune and --out out to measure its heads")
    if not all(block.attention.gates_heads for block in classifier.model.blocks):
        raise ValueError(f"{path}: the heads of {config.attention} cannot be told apart in its output (no output "
                         "projection found by name, e.g. out_proj / W_O): prune.py has no head to measure")


def run(args, stdout) -> int:
    import torch

    from data.checkpoint import CheckpointError, open_checkpoint
    from data.files import WriteError, check_target, write_atomically
    from inference import TextClassifier
    from inference.classifier import FACE_FLAGS
    from inference.heads import (ablation, accuracy, head_importance, labelled, least_important, prune_checkpoint,
                                 pruned_classifier, pruning_table)
    from model.kinds import attention_kind

    try:  # every input checked before the computation (minutes on a real split)
        if args.out is not None:
            check_target(args.out, "pruned checkpoint (--out)", inputs=[args.ckpt])
        path, checkpoint = open_checkpoint(args.ckpt)  # a run folder: its best checkpoint, as predict.py reads it
        args.ckpt = str(path)
        classifier = TextClassifier.from_checkpoint(path, device="cpu", checkpoint=checkpoint,
                                                    attention=args.attention_class,
                                                    allow_changed=args.allow_changed_class, flags=FACE_FLAGS)
        cuts = attention_kind(classifier.model.config.attention).heads_cut  # else its heads measured, not cut
        check_heads(classifier, path, args.prune is not None)
        importance_data = labelled(classifier, path, args.importance_split, args.importance_limit, seed=0,
                                   checkpoint=checkpoint)
        data = labelled(classifier, path, args.split, args.limit, checkpoint=checkpoint)
        importance = head_importance(classifier.model, importance_data)
        removed = least_important(importance, args.prune) if args.prune is not None else None
    except (CheckpointError, ValueError) as e:  # WriteError and DataError are ValueErrors
        raise SystemExit(f"error: {e}") from None
    base, heads, agreement = ablation(classifier.model, importance, data)
    table = [] if args.no_table or not cuts else pruning_table(classifier, checkpoint, importance, data)
    print(markdown(heads, agreement, table), file=sys.stderr)
    if not cuts and not args.no_table:
        print(f"\nno table of heads kept: the heads of a user's class ({classifier.model.config.attention}) are "
              "measured, never cut out of a checkpoint", file=sys.stderr)
    result = {"checkpoint": str(args.ckpt), "split": args.split, "texts": sum(len(b[2]) for b in data),
              "importance_split": args.importance_split, "importance_texts": sum(len(b[2]) for b in importance_data),
              "accuracy": round(base, 4), "heads": heads, "importance_vs_ablation_spearman": agreement,
              "table": table}
    if removed is not None:
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
    print(json.dumps(result), file=stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
