"""Which explanation is faithful for this model? Every method of inference/explain.py against exact occlusion,
over a dataset split (or your own texts).

    python -m bench.faithfulness --ckpt lightning_logs/version_0/checkpoints/best-*.ckpt
    python -m bench.faithfulness --ckpt CKPT --split validation --limit 200 --ig-steps 32
    python -m bench.faithfulness --ckpt CKPT --text "the acting is wonderful"

Per method, over the texts: the mean Spearman rank correlation with occlusion (texts where it is defined: two or
more tokens, neither side constant), and the deletion curve: the mean drop of the predicted class's probability
when the top-k tokens by the method are replaced by [UNK], k = 1..5 (a text shorter than k is left out of that k);
AOPC is the mean of the curve. "random" (random orders, averaged) is the floor; occlusion's own curve is the
greedy one-token-at-a-time truth, not an upper bound for k > 1. The split is the one the checkpoint was trained
with (its data settings; ATTENTION_DATA_ROOT for the local copy). A markdown table goes to stderr; the last line of
stdout is a JSON object with every figure.
"""

import argparse
import json
import sys
import time

import numpy as np
import torch


from data.checkpoint import CheckpointError
from data.reading import has_text
from inference import TextClassifier
from inference.explain import METHODS, explain_ids
from inference.limits import IG_STEPS_DEFAULT
from inference.splits import checkpoint_split

def summarise(results: list[dict], ks=(1, 2, 3, 4, 5)) -> dict:
    methods = [m for m in METHODS if m != "occlusion" and any(r["faithfulness"]["spearman"].get(m) is not None
                                                               for r in results)]
    spearman = {}
    for m in methods:
        values = [r["faithfulness"]["spearman"][m] for r in results if r["faithfulness"]["spearman"].get(m) is not None]
        spearman[m] = {"mean": round(float(np.mean(values)), 4), "median": round(float(np.median(values)), 4),
                       "texts": len(values)}
    deletion = {}
    for m in [*METHODS, "random"]:
        curve = []
        for i, k in enumerate(ks):
            drops = [r["faithfulness"]["deletion"][m][i] for r in results
                     if m in r["faithfulness"]["deletion"] and len(r["faithfulness"]["ks"]) > i]
            curve.append(round(float(np.mean(drops)), 4) if drops else None)
        if any(c is not None for c in curve):
            deletion[m] = {"curve": curve, "aopc": round(float(np.mean([c for c in curve if c is not None])), 4)}
    return {"spearman_with_occlusion": spearman, "deletion": deletion, "ks": list(ks)}


def markdown(summary: dict) -> str:
    ks = summary["ks"]
    lines = ["| method | Spearman with occlusion (mean) | " + " | ".join(f"drop k={k}" for k in ks) + " | AOPC |",
             "|:--|--:|" + "--:|" * len(ks) + "--:|"]
    for m, figures in summary["deletion"].items():
        r = summary["spearman_with_occlusion"].get(m, {}).get("mean")
        r = "—" if r is None else f"{r:.3f}"
        curve = " | ".join("—" if c is None else f"{c:.3f}" for c in figures["curve"])
        lines.append(f"| {m} | {r} | {curve} | {figures['aopc']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, help="checkpoint written by train.py")
    parser.add_argument("--split", default="validation", help="split of the checkpoint's dataset (default validation)")
    parser.add_argument("--limit", type=int, default=None, metavar="N", help="the first N texts of the split only")
    parser.add_argument("--text", action="append", help="explain this text instead of a split (repeatable)")
    parser.add_argument("--ig-steps", type=int, default=IG_STEPS_DEFAULT,
                        help=f"Integrated Gradients steps (default {IG_STEPS_DEFAULT})")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.ig_steps < 1:
        parser.error(f"--ig-steps must be >= 1, got {args.ig_steps}")
    if args.limit is not None and args.limit < 1:
        parser.error(f"--limit must be >= 1, got {args.limit}")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        classifier = TextClassifier.from_checkpoint(args.ckpt, device="cpu")
    except (CheckpointError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    try:
        texts = args.text or checkpoint_split(args.ckpt, args.split)[0]
    except ValueError as e:  # DataError is a ValueError
        raise SystemExit(f"error: {e} (bench/faithfulness.py also takes --text)") from None
    texts = [t for t in texts if has_text(t)][: args.limit]
    if not texts:
        raise SystemExit("error: no (non-empty) texts to explain")
    ids, _, _ = classifier.encode(texts)
    results, times = [], []
    for i, text_ids in enumerate(ids):
        start = time.perf_counter()
        results.append(explain_ids(classifier.model, text_ids, ig_steps=args.ig_steps, seed=i))
        times.append(time.perf_counter() - start)
    seconds = sum(times)
    summary = summarise(results) | {"texts": len(texts), "seconds": round(seconds, 2),
                                    "ms_per_text": round(1000 * seconds / len(texts), 1),
                                    "ms_per_text_median": round(1000 * float(np.median(times)), 1),
                                    "ms_per_text_max": round(1000 * max(times), 1),
                                    "tokens_per_text_max": max(len(t) for t in ids), "ig_steps": args.ig_steps,
                                    "threads": torch.get_num_threads(), "checkpoint": str(args.ckpt),
                                    "split": None if args.text else args.split}
    print(markdown(summary), file=sys.stderr)
    print(f"{len(texts)} texts in {seconds:.1f} s: all methods and curves in {summary['ms_per_text']} ms per text "
          f"(median {summary['ms_per_text_median']}, longest {summary['ms_per_text_max']})", file=sys.stderr)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
