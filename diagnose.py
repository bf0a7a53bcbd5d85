"""Diagnose a trained checkpoint's attention: the attention doctor's checks on a validation sample of its data.

The checks, verdicts and report are built in inference/diagnosis.py; this face parses the command line and prints.
"""

import argparse
import logging
import sys
from pathlib import Path

import runtime
from inference.limits import POSITIVE, Parser, fraction

DESCRIPTION = """\
Run the attention doctor on a checkpoint from train.py: its checks (weight on padding, row sums, a look-ahead
nobody asked for, score spread, gradient passed, identical heads, heads zeroed one at a time, tokens shuffled) and
its contract checks (each layer recomputed from its own input and weights by its kind's definition, stage by stage;
predictions that more padding or other batch neighbours must not move; the scale setting) on a sample of the run's
validation texts, plus the verdicts the AttentionMonitor stored at every validation while the run trained (in the
checkpoint and in the run's last.ckpt beside it: a parameter that never learned, a model that never learned), and
whether the checkpoint itself answers better than a constant (not-learning, once trained past its first
epochs). Prints each finding with the figures behind it, its likely cause and what to try, and writes a one-page
HTML report (the verdicts, every head's map of two texts on one 0-1 scale titled with its verdict, the figures, the
training history). The verdict table: docs/DOCTOR.md.

The data are those the checkpoint recorded (dataset, files, columns); --data.* replaces them, as in train.py.
Exit status: 0 no warning, 1 a warning here or at any stored validation (a bug class: guard a CI job with it), 2
bad input (a missing or broken checkpoint, a bad flag, unreadable data), with a one-line error."""

EPILOG = """\
examples:
  python diagnose.py --attention my_attention.py:SelfAttention            # your own class: the contract alone
  python diagnose.py --attention my_attention.py:MHA --map q=lin_q,k=lin_k,v=lin_v,o=lin_out
  python diagnose.py --ckpt lightning_logs/version_0                      # the run's best checkpoint
  python diagnose.py --ckpt last.ckpt --data.dataset sst2 --html sst2.html
  python diagnose.py --ckpt run/checkpoints/last.ckpt --data.train_file reviews.csv --data.text_column review
"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = Parser(prog="diagnose.py", description=DESCRIPTION, epilog=EPILOG,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", metavar="RUN_OR_CKPT",
                        help="a checkpoint written by train.py, or a run folder (lightning_logs/version_N: its best "
                             "checkpoint)")
    parser.add_argument("--attention", metavar="FILE.py:CLASS",
                        help="your own attention class alone, no checkpoint, no data: the attention contract on a "
                             "freshly built layer (shapes, softmax rows, padding, batch neighbours, evaluation "
                             "passes, permutation, the formula from its own weights, the scale, a long input, "
                             "gradcheck, gradient); exit 1 on any FAIL (docs/OWN_ATTENTION.md). With --ckpt: the "
                             "class a checkpoint of your own class was trained with (a checkpoint never imports "
                             "code by itself; its file's sha256 must equal the recorded one)")
    parser.add_argument("--allow-changed-class", action="store_true",
                        help="with --ckpt and --attention: load the class although its file's sha256 differs from "
                             "the one the checkpoint records")
    own = parser.add_argument_group("--attention alone (not with --ckpt)")
    own.add_argument("--map", type=projection_map, metavar="q=ATTR,k=ATTR,v=ATTR,o=ATTR",
                     help="where the class keeps W_Q, W_K, W_V, W_O (or qkv=ATTR for one fused Linear) when their "
                          "names are not found")
    own.add_argument("--d-model", type=POSITIVE.argument(), metavar="N", help="model width D (default: 64)")
    own.add_argument("--heads", type=POSITIVE.argument(), metavar="N", help="heads, when the class takes them "
                                                                     "(default: 4)")
    own.add_argument("--max-length", type=POSITIVE.argument(), metavar="N",
                     help="the longest text the class will read (the long-input probe's length; default: 128, "
                          "the network's default max_length)")
    own.add_argument("--d-head", type=POSITIVE.argument(), metavar="N", help="head size (default: d_model / heads)")
    own.add_argument("--learn", action="store_true",
                     help="add the last check: the class trained in the classifier on the synthetic task "
                          "(configs/smoke.yaml) must reach the built-in full layer's accuracy in the same epochs "
                          "(both trained here: seconds to a minute)")
    own.add_argument("--args", type=json_object, metavar="JSON", help="its other constructor arguments, a JSON "
                                                                      "object: '{\"window\": 8}'")
    data = parser.add_argument_group("data (default: what the checkpoint recorded)")
    for name, help_text in (("dataset", "a registered dataset: sst2, chnsenticorp_htl, ag_news, imdb, synthetic"),
                            ("data_dir", "a local copy of the registered dataset"),
                            ("train_file", "your own CSV/TSV/JSON/JSONL/parquet file (replaces dataset)"),
                            ("val_file", "its validation file (else a share of train_file is held out)"),
                            ("text_column", "column holding the text"), ("label_column", "column holding the label")):
        data.add_argument(f"--data.{name}", dest=name, metavar="VALUE", help=help_text)
    data.add_argument("--data.val_fraction", dest="val_fraction", type=fraction, metavar="F",
                      help="share of train_file held out for validation without val_file")
    data.add_argument("--data.seed", dest="seed", type=int, metavar="N", help="seed of that held-out share")
    parser.add_argument("--texts", type=POSITIVE.argument(), default=1000, metavar="N",
                        help="validation texts to check, a seeded random sample (default: 1000)")
    parser.add_argument("--batch-size", type=POSITIVE.argument(), default=64, metavar="N",
                        help="texts per forward pass")
    parser.add_argument("--html", metavar="FILE",
                        help="where to write the HTML report (default: <checkpoint>.diagnosis.html next to the "
                             "checkpoint, or diagnosis.html in --out)")
    parser.add_argument("--out", metavar="DIR", help="a folder for the report instead of the checkpoint's")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                        help="where the network runs (default: cpu)")
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    args = parser.parse_args(argv)
    alone = {"--map": args.map, "--d-model": args.d_model, "--heads": args.heads, "--d-head": args.d_head,
             "--max-length": args.max_length, "--learn": args.learn or None, "--args": args.args}
    if args.ckpt is None and args.attention is None:
        parser.error("give --ckpt (a checkpoint or run folder) or --attention (your own class alone)")
    if args.ckpt is not None:
        given = [flag for flag, value in alone.items() if value is not None]
        if given:  # a checkpoint's network fixes them all: refused rather than ignored
            parser.error(f"{', '.join(given)} go with --attention alone: a checkpoint's network has its own "
                         "(to check the class with them, leave --ckpt out)")
    elif args.allow_changed_class:
        parser.error("--allow-changed-class goes with --ckpt and --attention")
    else:
        given = [f"--data.{name}" for name in DATA_NAMES if getattr(args, name, None) is not None]
        if given:
            parser.error(f"{', '.join(given)} go with --ckpt: --attention alone checks the class on random inputs, "
                         "no data")
    args.d_model = args.d_model or 64
    args.heads = args.heads or 4
    args.max_length = args.max_length or 128
    return args


DATA_NAMES = ("dataset", "data_dir", "train_file", "val_file", "text_column", "label_column", "val_fraction", "seed")


def projection_map(value: str) -> dict[str, str]:
    """"q=attr,k=attr,v=attr,o=attr" (or "qkv=attr,o=attr") → {role: attribute path}."""
    found = {}
    for part in value.split(","):
        role, sep, path = part.partition("=")
        role, path = role.strip().lower(), path.strip()
        if not sep or role not in ("q", "k", "v", "o", "qkv") or not path:
            raise argparse.ArgumentTypeError(f"expected q=ATTR,k=ATTR,v=ATTR[,o=ATTR] or qkv=ATTR[,o=ATTR], got "
                                             f"{part!r}")
        found[role] = path
    if not ({"q", "k", "v"} <= found.keys() or "qkv" in found):
        raise argparse.ArgumentTypeError(f"name q, k and v (or qkv), got {value!r}")
    return found


def json_object(value: str) -> dict:
    import json

    try:
        found = json.loads(value)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e.msg} at character {e.pos}): {value!r}") from None
    if not isinstance(found, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"window\": 8}}', got {value!r}")
    return found


class SlowClassProgress:
    """While the contract runs: the forwards of the user's class counted and, once they have taken SLOW_AFTER
    seconds, a line on stderr every PROGRESS_EVERY seconds with how many ran and about how long the rest takes
    (CONTRACT_FORWARDS at the default sizes; a fast class prints nothing)."""

    SLOW_AFTER, PROGRESS_EVERY = 3.0, 10.0
    CONTRACT_FORWARDS = 35  # forwards of the class in the contract without --learn (docs/examples/my_attention.py)

    def __init__(self, spec: str):
        self.spec = spec

    def __enter__(self):
        import time

        from torch.nn.modules.module import register_module_forward_hook

        from model.own_attention import load_attention_class

        self.cls = load_attention_class(self.spec)  # the class the contract builds (a file runs once)
        self.count, self.started, self.said = 0, time.monotonic(), None
        self.handle = register_module_forward_hook(self.seen)
        return self

    def seen(self, module, args, output):
        import time

        if type(module) is not self.cls:
            return
        self.count += 1
        now = time.monotonic()
        spent = now - self.started
        if spent < self.SLOW_AFTER or self.said is not None and now - self.said < self.PROGRESS_EVERY:
            return
        self.said = now
        left = max(self.CONTRACT_FORWARDS - self.count, 0) * spent / self.count
        print(f"diagnose.py: {self.spec}: {self.count} forwards of the class in {spent:.0f} s "
              f"({spent / self.count:.1f} s each); about {left:.0f} s more (the contract runs it about "
              f"{self.CONTRACT_FORWARDS} times)", file=sys.stderr,
              flush=True)

    def __exit__(self, *exc):
        self.handle.remove()
        return False


def attention_main(args) -> int:
    """The contract on a user's class alone: the table, exit 1 on any FAIL, 2 on bad input."""
    from monitor.layer_contract import layer_contract, table

    try:
        with SlowClassProgress(args.attention):
            rows = layer_contract(args.attention, d_model=args.d_model, n_heads=args.heads, d_head=args.d_head,
                                  args=args.args, mapping=args.map, learn=args.learn, max_length=args.max_length)
    except ValueError as e:  # ConfigError: the file, the class, its constructor; a --map attribute not found
        if args.debug:
            raise
        print(f"diagnose.py: error: {e}", file=sys.stderr)
        return 2
    print(f"attention contract of {args.attention} (d_model {args.d_model}, {args.heads} heads):")
    print(table(rows))
    return 1 if any(row.verdict == "FAIL" for row in rows) else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    runtime.configure()  # before torch loads: runtime.py
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.ckpt is None:
        return attention_main(args)
    from tqdm import tqdm

    from data.files import WriteError, check_target, make_folder, write_text
    from data.sources import DataError
    from inference.diagnosis import diagnose_checkpoint, html_report, text_report
    from inference.splits import SPLIT_KEYS
    from data.checkpoint import CheckpointError

    data = {name: getattr(args, name, None) for name in SPLIT_KEYS}  # --data.* given here, over the recorded ones
    targets = []

    def check_report_target(checkpoint: Path, settings: dict) -> None:
        """Before any data is read: the report's target can be written and is none of the files read."""
        if args.out:
            make_folder(args.out, "report folder")
        target = Path(args.html) if args.html else (
            Path(args.out) / "diagnosis.html" if args.out else checkpoint.with_suffix(".diagnosis.html"))
        inputs = [args.ckpt, checkpoint, *(settings.get(key) for key in ("train_file", "val_file", "test_file"))]
        targets.append(check_target(target, "report", inputs=inputs))

    try:
        diagnosis = diagnose_checkpoint(
            args.ckpt, data, texts=args.texts, batch_size=args.batch_size, device=args.device,
            progress=lambda batches: tqdm(batches, desc="checking", unit="batch", leave=False,
                                          disable=len(batches) < 20 and not sys.stderr.isatty()),
            before=check_report_target, attention=args.attention, allow_changed=args.allow_changed_class,
        )
        (target,) = targets
        write_text(target, html_report(diagnosis), "report", inputs=[args.ckpt, diagnosis.checkpoint])
    except (CheckpointError, DataError, WriteError, ValueError, OSError) as e:
        if args.debug:
            raise
        print(f"diagnose.py: error: {e}", file=sys.stderr)
        return 2
    print(text_report(diagnosis))
    print(f"report: {target}")
    return 1 if diagnosis.warnings else 0


if __name__ == "__main__":
    sys.exit(main())
