"""Classify new texts with a trained checkpoint: one JSON object per input on stdout.

For a whole dataset split with its labels, use `python train.py predict --config ... --ckpt_path ...` instead.
The Python API behind this script is `inference.TextClassifier` (inference/classifier.py).
"""

import argparse
import contextlib
import json
import logging
import sys
from pathlib import Path

from tqdm import tqdm

import runtime
from data.reading import has_text
from inference.faces import add_class_arguments, check_class_arguments, notes_to_stderr, run_face
from inference.limits import BATCH_SIZE, IG_STEPS, IG_STEPS_DEFAULT, POSITIVE, PREDICT_BATCH
from inference.texts import EMPTY

log = logging.getLogger("predict")
PROGRESS_BAR_ABOVE = 1000  # inputs; below this a bar shows only when stderr is a terminal
TEXTS_PER_STEP = 16  # batches predicted (and written out) at a time, so output streams and memory stays flat
NOTES_SHOWN = 10  # per kind of note; the rest are counted

DESCRIPTION = """\
Classify texts with a checkpoint from train.py. Prints one JSON object per input on stdout:
  {"text": ..., "label": <label name>, "probabilities": {<label name>: p, ...}}
A model of several labels a text adds "labels": [<label name>, ...] (those reaching their thresholds, most probable
first; "label" joins them), and with --show-thresholds "thresholds": {<label name>: the probability it needs}; the
server's GET /info lists them too. Probabilities are calibrated on validation (docs/LABELS.md).
Notes (truncated texts, replaced bytes, empty lines) go to stderr.

Empty or whitespace-only inputs are not skipped: each gives {"text": ..., "error": "empty text"}, so output
line N always belongs to input line N (paste/join the output with the input file), and a count goes to stderr.
Lines end at \\n only (a \\r\\n ending loses its \\r; a lone \\r or other line separator inside a line stays
in the text). Texts longer than the model's max_length tokens are cut to it, as in training: their output gets
"truncated_from": <length in tokens> and stderr a note. Bytes that are not UTF-8 are replaced by U+FFFD.
A model whose probabilities are NaN or infinite gives {"text": ..., "error": ...} for that input, never NaN.
A checkpoint that is missing, corrupt, unsafe or not from train.py gives a one-line error and exit status 2."""

EPILOG = """\
examples:
  python predict.py --ckpt lightning_logs/version_0/checkpoints/last.ckpt "a charming and affecting journey"
  python predict.py --ckpt last.ckpt --file reviews.txt > predictions.jsonl
  python predict.py --ckpt runs/seed0 --ckpt runs/seed1 --ckpt runs/seed2 "not bad"   # ensemble of best checkpoints
  # a table's text column: every line is a text, a header line too, so tail skips it (the SST-2 copy `make` uses)
  tail -n +2 "$ATTENTION_DATA_ROOT/sst2/validation.tsv" | cut -f1 | python predict.py --ckpt last.ckpt --file -
  python predict.py --ckpt last.ckpt --attention "alpha w3 beta" | python -m json.tool
  python predict.py --ckpt last.ckpt --attention-png heatmaps/ --file reviews.txt   # heatmaps/0000.png, ...
  python predict.py --ckpt last.ckpt --explain --html report.html "the acting is wonderful"
"""


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="predict.py", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("texts", nargs="*", metavar="TEXT", help="texts to classify (or use --file)")
    parser.add_argument("--ckpt", required=True, metavar="PATH", action="append",
                        help="checkpoint written by train.py, e.g. lightning_logs/version_0/checkpoints/last.ckpt, or "
                             "a run folder (lightning_logs/version_0: its best checkpoint); given several times, "
                             "an ensemble: their probabilities averaged")
    parser.add_argument("--file", metavar="F", help="read one text per line from F, every line a text (a header line "
                                                    "too); '-' reads standard input")
    parser.add_argument("--top-k", type=POSITIVE.argument(), metavar="K",
                        help="keep only the K most likely labels in probabilities, most likely first (default: all, "
                             "in label order)")
    parser.add_argument("--show-thresholds", action="store_true",
                        help="a model of several labels a text: add 'thresholds' to each answer, per label the "
                             "probability it needs to be in 'labels' (fitted on validation; stored in the checkpoint, "
                             "an ensemble's averaged). A model of one label a text has none: its label is the most "
                             "probable")
    parser.add_argument("--attention", action="store_true",
                        help="add 'tokens' (what the model saw) and 'attention': per layer a tokens × tokens matrix "
                             "(query rows, key columns), averaged over heads, rounded to 6 decimals. Long-text kinds "
                             "give each row's own keys (tokens × K) and 'attention_keys' (tokens × K: the token of "
                             "each column; -1 everywhere: projected keys, no token; a position below 0 or past "
                             "the last token is a band slot outside the text, no key, weight 0); sparse also "
                             "'global_attention' "
                             "(the global tokens' rows over all tokens); see README 'Long texts'")
    parser.add_argument("--all-heads", action="store_true",
                        help="with --attention, give every head: per layer, per head, a tokens × tokens matrix")
    parser.add_argument("--attention-png", metavar="DIR",
                        help="write an attention heatmap per input (layers × heads) to DIR/0000.png, DIR/0001.png, "
                             "... (numbered from 0 in input order) and name it in the output as 'attention_png'")
    parser.add_argument("--explain", action="store_true",
                        help="instead of attention, say why: per token, for the predicted class, scores from raw "
                             "attention, attention rollout, gradient × input, Integrated Gradients and exact occlusion, "
                             "with each method's faithfulness for that text (docs/EXPLAIN.md); "
                             "with --attention also 'attention': per layer, per head, the tokens × tokens weights the "
                             "page draws (null for linformer)")
    parser.add_argument("--html", metavar="FILE",
                        help="with --explain, also write one self-contained HTML page for the texts to FILE")
    parser.add_argument("--ig-steps", type=IG_STEPS.argument(), default=IG_STEPS_DEFAULT, metavar="N",
                        help=f"with --explain, Integrated Gradients steps, {IG_STEPS} (default: {IG_STEPS_DEFAULT})")
    parser.add_argument("--batch-size", type=BATCH_SIZE.argument(), default=PREDICT_BATCH, metavar="N",
                        help=f"texts per forward pass, {BATCH_SIZE} (default: {PREDICT_BATCH}); texts are batched by "
                             "length internally")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="where the network runs; auto picks cuda when available (default: auto)")
    add_class_arguments(parser)
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    args = parser.parse_args(argv)
    check_class_arguments(parser, args)
    if bool(args.texts) == bool(args.file):
        parser.error("give either TEXT arguments or --file (not both, not neither)")
    if args.all_heads and not args.attention:
        parser.error("--all-heads goes with --attention")
    if args.html and not args.explain:
        parser.error("--html goes with --explain")
    if len(args.ckpt) > 1 and (args.attention or args.attention_png or args.explain):
        parser.error("attention belongs to one network: --attention, --attention-png and --explain take one --ckpt")
    return args


def read_inputs(args) -> list[str]:
    """The texts, one per TEXT argument or per line of --file; undecodable bytes are replaced, with a note."""
    if args.texts:
        raw = [argument_bytes(text) for text in args.texts]
        where = "text"
    elif args.file == "-":
        if sys.stdin is None:  # started with standard input closed (`<&-`)
            raise InputError("--file -: standard input is closed; give texts as arguments or --file PATH")
        raw, where = split_lines(sys.stdin.buffer.read()), "line"
    else:
        path = Path(args.file)
        if not path.is_file():
            raise InputError(f"{path}: file not found" if not path.exists() else f"{path}: not a file")
        raw, where = split_lines(path.read_bytes()), "line"
    texts, replaced = [], []
    for number, data in enumerate(raw, start=1):
        try:
            texts.append(data.decode("utf-8"))
        except UnicodeDecodeError:
            texts.append(data.decode("utf-8", errors="replace"))
            replaced.append(number)
    if replaced:
        shown = ", ".join(map(str, replaced[:NOTES_SHOWN])) + (", ..." if len(replaced) > NOTES_SHOWN else "")
        log.info("%d input(s) held bytes that are not UTF-8, replaced by U+FFFD (%s %s)", len(replaced), where, shown)
    return texts


def argument_bytes(text: str) -> bytes:
    """The bytes of a TEXT argument. Undecodable bytes in argv arrive as lone surrogates U+DC80..U+DCFF
    (surrogateescape), which give the bytes back; any other lone surrogate (a Python caller's "\\ud800") becomes
    the three bytes UTF-8 would give it, which are not UTF-8 either: both are then replaced like any such bytes."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def split_lines(data: bytes) -> list[bytes]:
    r"""Lines split at \n only, one trailing \r of a \r\n ending removed. bytes.splitlines would also split at
    a lone \r, \v, \f and \x1c-\x1e, so output line N would no longer belong to input line N."""
    lines = data.split(b"\n")
    if lines[-1] == b"":  # what follows the last newline: nothing, unless the file lacks a final one
        lines.pop()
    return [line.removesuffix(b"\r") for line in lines]


def json_line(output: dict) -> str | None:
    """One line of JSON, or None when a number in it is NaN or infinite (not JSON, and a broken model)."""
    try:
        return json.dumps(output, ensure_ascii=False, allow_nan=False) + "\n"
    except ValueError:
        return None


class InputError(ValueError):
    pass


def main(argv=None) -> int:
    args = parse_args(argv)
    runtime.configure()  # before torch loads: runtime.py
    notes_to_stderr(log, "note: ")
    return run_face(run, args)  # CheckpointError, InputError, a bad --device: one line, no traceback


def run(args) -> int:
    """The answers on stdout, as JSON lines only: anything else written to stdout while they are computed (a
    user's class that prints in its forward) goes to stderr."""
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        return answer(args, stdout)


def answer(args, stdout) -> int:
    # Imported here, not at the top, so --help and argument errors answer without loading torch.
    from inference.answers import NON_FINITE, load, prediction_outputs, truncation_note

    texts = read_inputs(args)
    classifier = load(args.ckpt, device=args.device, attention=args.attention_class,
                      allow_changed=args.allow_changed_class)
    if args.show_thresholds and not classifier.multi_label:
        raise InputError(f"--show-thresholds: {args.ckpt[0]} gives one label a text (the most probable), it has no "
                         "thresholds")
    if args.explain:
        return run_explain(args, classifier, texts, stdout)
    png_dir = Path(args.attention_png) if args.attention_png else None
    if png_dir is not None:
        from data.files import make_folder

        make_folder(png_dir, "heatmap folder")  # WriteError, one line: a file in the way, no permission, ...
    digits = max(4, len(str(len(texts) - 1)))
    where = "text" if args.texts else "line"
    unread, truncated, broken = [], [], []
    show_bar = len(texts) > PROGRESS_BAR_ABOVE or sys.stderr.isatty()
    step = args.batch_size * TEXTS_PER_STEP
    with tqdm(total=len(texts), unit="text", file=sys.stderr, disable=not show_bar) as bar:
        for start in range(0, len(texts), step):
            window = range(start, min(start + step, len(texts)))
            pairs = prediction_outputs(
                classifier, [texts[i] for i in window], attention=args.attention, all_heads=args.all_heads,
                top_k=args.top_k, batch_size=args.batch_size, weights=png_dir is not None,
                thresholds=args.show_thresholds,
            )
            encoded = []
            for i, (out, prediction) in zip(window, pairs):
                if prediction is None:
                    unread.append((i + 1, out["error"]))
                else:
                    if png_dir is not None:
                        out["attention_png"] = str(write_png(prediction, png_dir / f"{i:0{digits}d}.png"))
                    if prediction.truncated_from is not None:
                        truncated.append((i + 1, prediction.truncated_from))
                text = json_line(out)
                if text is None:
                    broken.append(i + 1)
                    text = json_line({"text": out["text"], "error": NON_FINITE})
                encoded.append(text)
            stdout.write("".join(encoded))
            stdout.flush()
            bar.update(len(window))
    for number, length in truncated[:NOTES_SHOWN]:
        log.info("%s %d: %s", where, number, truncation_note(texts[number - 1], length, classifier.max_length))
    if len(truncated) > NOTES_SHOWN:
        log.info("... %d texts truncated in all", len(truncated))
    if broken:
        shown = ", ".join(map(str, broken[:NOTES_SHOWN])) + (", ..." if len(broken) > NOTES_SHOWN else "")
        log.info("%d input(s) reported as errors: %s (%s %s)", len(broken), NON_FINITE, where, shown)
    note_unread(unread, where)
    return 0


def note_unread(unread: list[tuple[int, str]], where: str) -> None:
    """A note per kind of input the model cannot read (empty, not Unicode), counting them."""
    empty = [number for number, error in unread if error == EMPTY]
    if empty:
        shown = ", ".join(map(str, empty[:NOTES_SHOWN])) + (", ..." if len(empty) > NOTES_SHOWN else "")
        log.info('%d empty input(s) reported as {"error": "empty text"} (%s %s)', len(empty), where, shown)
    for number, error in [item for item in unread if item[1] != EMPTY][:NOTES_SHOWN]:
        log.info("%s %d: %s", where, number, error)


def run_explain(args, classifier, texts: list[str], stdout) -> int:
    """--explain: one JSON object per input (an empty one gives {"text", "error"}), and the page with --html.
    The page's target is checked before any explanation is computed; with no non-empty input it is not written."""
    where = "text" if args.texts else "line"
    if args.html:
        from data.files import check_target

        if not any(has_text(text) for text in texts):
            raise InputError(f"{args.html}: not written: every input is empty, there is nothing to explain")
        check_target(args.html, "report", inputs=[*args.ckpt, *([args.file] if args.file not in (None, "-") else [])])
    from inference.answers import NON_FINITE, explanation_outputs, token_count

    pairs = explanation_outputs(classifier, texts, attention=args.attention, ig_steps=args.ig_steps)
    for i, (out, explanation) in enumerate(pairs):
        stdout.write(json_line(out) or json_line({"text": out["text"], "error": NON_FINITE}))
        if explanation is not None and explanation.truncated_from is not None:
            log.info("%s %d: %s; explained as the model saw it, its first %d", where, i + 1,
                     token_count(texts[i], explanation.truncated_from), classifier.max_length)
    note_unread([(i + 1, out["error"]) for i, (out, explanation) in enumerate(pairs) if explanation is None], where)
    if args.html:
        from inference.report import write_report

        write_report([explanation for _, explanation in pairs if explanation is not None], args.html,
                     classifier.verdicts)
        log.info("report written to %s", args.html)
    return 0


def write_png(prediction, path: Path) -> Path:
    from monitor.heatmap import attention_figure, save_png  # matplotlib only when heatmaps are asked for

    text = prediction.text if len(prediction.text) <= 60 else prediction.text[:59] + "…"
    title = f"{prediction.label} ({max(prediction.probabilities.values()):.2f}): {text}"
    figure = attention_figure(prediction.attention, prediction.tokens, title=title,
                              key_positions=prediction.attention_keys, global_weights=prediction.global_attention)
    return save_png(figure, path)


if __name__ == "__main__":
    sys.exit(main())
