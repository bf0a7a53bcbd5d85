"""Export a checkpoint to ONNX, attention weights included: DIR/model.onnx, DIR/tokenizer.json, DIR/config.json.

    python export.py --ckpt lightning_logs/version_0 --out exported/ --attention

The graph is the network's own forward (torch.export, then ONNX through onnxscript), with the hand-written attention
formula in it (MatMul → Softmax → MatMul, never a fused attention op: a checkpoint trained with the fused kernel is
exported with the written one, which gives the same numbers). Inputs and outputs follow the transformers convention;
config.json says everything else a user needs (tests/test_export.py checks it all with onnxruntime alone).
"""

import argparse
import contextlib
import importlib
import io
import json
import logging
import re
import sys
import warnings
from pathlib import Path

import runtime
from inference.faces import add_class_arguments, check_class_arguments, notes_to_stderr, run_face

log = logging.getLogger("export")

DESCRIPTION = """\
Export a checkpoint from train.py to ONNX, keeping the attention. Writes into DIR:
  model.onnx      inputs  input_ids (int64, B × L), attention_mask (int64, B × L: 1 real token, 0 padding);
                  B and L are dynamic, L at most max_length, padding on the right
                  outputs logits (float32, B × classes, in the order of config.json's labels), probabilities
                  (float32, B × classes: the calibrated softmax, logits / the temperature fitted on validation;
                  several labels a text: a sigmoid per label, the answer those reaching config.json's
                  thresholds) and, with
                  --attention, one output per layer, attention.0 … attention.N-1 (float32, B × H × L × L: query
                  rows, key columns; the layout of `predict.py --attention --all-heads`; a long-text kind gives
                  B × H × L × K in its own key layout, with attention_keys (int64, L × K: the token of each column,
                  -1 for a linformer projected key) and, for sparse, global_attention.0 … (B × H × g × L))
  tokenizer.json  the checkpoint's tokenizer for `tokenizers.Tokenizer.from_file`, truncating to max_length and
                  padding a batch on the right: encode_batch gives input_ids and attention_mask as model.onnx takes them
  config.json     label names in output order, multi_label, temperature, thresholds, max_length, attention kind, how to pad, the network's settings
Kinds that cannot be exported get a one-line error naming why; nothing in DIR is half-written."""

EPILOG = """\
example, in Python with only the files in DIR:
  import numpy as np, onnxruntime, tokenizers
  tokenizer = tokenizers.Tokenizer.from_file("DIR/tokenizer.json")
  batch = tokenizer.encode_batch(["a charming and affecting journey", "dull"])
  feed = {"input_ids": np.array([e.ids for e in batch]), "attention_mask": np.array([e.attention_mask for e in batch])}
  logits = onnxruntime.InferenceSession("DIR/model.onnx").run(["logits"], feed)[0]
"""

OPSET = 18
# The trace's sizes: L not a multiple of any usual window, a padded row, B and L above 1 so that neither is taken
# for a constant. The exported axes are dynamic either way (tests/test_export.py runs other sizes).
TRACE_BATCH, TRACE_LENGTH = 3, 13


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="export.py", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, metavar="PATH", action="append",
                        help="checkpoint written by train.py, or a run folder (its best checkpoint); one only")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for model.onnx, tokenizer.json, "
                                                                    "config.json (created if missing)")
    parser.add_argument("--attention", action="store_true", help="add each layer's attention weights as outputs")
    add_class_arguments(parser)
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    args = parser.parse_args(argv)
    check_class_arguments(parser, args)
    if len(args.ckpt) > 1:
        parser.error("--ckpt given more than once: an export is one network (predict.py and serve.py average an "
                     "ensemble outside the networks); export each checkpoint to its own --out")
    args.ckpt = args.ckpt[0]
    return args


def exportable(classifier, attention: bool):
    """The network as an nn.Module of (input_ids, attention_mask) → logits [, weights…], in the export's layout."""
    import torch

    model = classifier.model

    class Exported(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, attention_mask):
            # The transformers mask (1 real, 0 padding) → this project's key_padding_mask (True at padding).
            output = self.model(input_ids, attention_mask == 0, need_weights=attention)
            return tuple(named_outputs(self.model, output, classifier.probabilities(output.logits)).values())

    return Exported().eval()


def named_outputs(model, output, probabilities) -> dict:
    """{name: tensor} of what the export hands out, in output order, from one forward's ClassifierOutput: the
    logits, the calibrated probabilities and, when it holds weights, each layer's, in the kind's key layout
    (model/kinds.py)."""
    outputs = {"logits": output.logits, "probabilities": probabilities}
    if output.attention is None:
        return outputs
    layers = output.attention
    outputs.update({f"attention.{i}": layer.weights for i, layer in enumerate(layers)})
    if layers[0].key_positions is not None:  # a long kind's own layout (model/attention.py's AttentionWeights)
        outputs["attention_keys"] = layers[0].key_positions
    if layers[0].global_rows is not None:
        outputs.update({f"global_attention.{i}": layer.global_rows.weights for i, layer in enumerate(layers)})
    return outputs


def output_names(classifier, attention: bool) -> list[str]:
    """The outputs' names, from what the network hands out on the trace inputs (one eager pass)."""
    import torch

    config = classifier.model.config
    input_ids, attention_mask = trace_inputs(config.max_length, config.vocab_size)
    with torch.no_grad():
        output = classifier.model(input_ids, attention_mask == 0, need_weights=attention)
    return list(named_outputs(classifier.model, output, output.logits))


def trace_inputs(max_length: int, vocab_size: int):
    import torch

    length = min(TRACE_LENGTH, max_length)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(2, max(3, vocab_size), (TRACE_BATCH, length), generator=generator)  # (B, L)
    attention_mask = torch.ones(TRACE_BATCH, length, dtype=torch.long)
    attention_mask[1, max(1, length // 2):] = 0  # a padded row
    return input_ids.masked_fill(attention_mask == 0, 0), attention_mask


def export_onnx(classifier, path: Path, names: list[str]) -> None:
    """model.onnx at path with the outputs `names` (output_names); ExportError (one line) when the network cannot
    be exported."""
    import torch

    config = classifier.model.config
    for block in classifier.model.blocks:
        if block.attention.runs_by_length:  # model/kind.py: a layer that takes no mask
            raise ExportError(f"the attention class {config.attention} takes no mask, so it is run on the texts of "
                              "each length apart, which a traced graph cannot hold: give its forward a mask "
                              "(forward(x, mask)) to export it")
        block.attention.kernel = "manual"  # the written formula in the graph, never scaled_dot_product_attention
    inputs = trace_inputs(config.max_length, config.vocab_size)
    axes = {"input_ids": {0: "batch", 1: "length"}, "attention_mask": {0: "batch", 1: "length"}}
    torch_log = logging.getLogger("torch")
    level = torch_log.level
    try:
        # torch.export prints the graph it traced when it fails (hundreds of lines, colour codes): the error line
        # below says what the user needs, so nothing of torch's own reaches the terminal.
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            torch_log.setLevel(logging.CRITICAL + 1)
            program = torch.onnx.export(
                exportable(classifier, attention=len(names) > 2), inputs, input_names=["input_ids", "attention_mask"],
                output_names=names, dynamic_axes=axes, opset_version=OPSET, dynamo=True, verbose=False,
            )
    except Exception as e:  # torch.export / onnxscript raise many kinds; their root cause says what failed
        raise ExportError(f"the {config.attention} attention of this checkpoint cannot be exported to ONNX: "
                          f"{export_failure(e)}") from e
    finally:
        torch_log.setLevel(max(level, logging.ERROR))
    from data.files import write_atomically

    write_atomically(path, lambda target: program.save(str(target)), what="ONNX model")


ANSI_CODES = re.compile(r"\x1b\[[0-9;]*m")


def export_failure(error: BaseException) -> str:
    """One line of why torch could not export: the first line of the root cause (torch's own message starts with
    its "Next steps" advice), and the user's line that raised it when torch names one, without colour codes."""
    root = error
    while root.__cause__ is not None:
        root = root.__cause__
    lines = [ANSI_CODES.sub("", line).strip() for line in str(root).splitlines()]
    reason = next((line for line in lines if line), type(root).__name__)
    everything = [ANSI_CODES.sub("", line).strip() for line in str(error).splitlines()]
    if "The following call raised this error:" in everything:
        at = everything.index("The following call raised this error:")
        where = [line for line in everything[at + 1:at + 3] if line]
        if where:
            reason += f" ({'; '.join(where)})"
    return reason[:400]


def export_tokenizer(classifier, max_length: int):
    """The checkpoint's tokenizer, truncating to max_length and padding a batch on the right with [PAD]."""
    from tokenizers import Tokenizer

    from data.tokenizer import PAD, PAD_ID

    tokenizer = Tokenizer.from_str(classifier.tokenizer.to_str())
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(direction="right", pad_id=PAD_ID, pad_token=PAD)
    return tokenizer


def export_config(classifier, checkpoint_name: str, names: list[str]) -> dict:
    from data.tokenizer import CHARS_PER_TOKEN_BOUND, PAD, PAD_ID, UNK, UNK_ID

    config = classifier.model.config
    layouts = {"logits": "B × classes, in the order of labels, before calibration",
               "probabilities": ("B × classes: sigmoid(logits) per label; a text's labels are those reaching their "
                                 "thresholds" if classifier.multi_label else
                                 "B × classes: softmax(logits / temperature), calibrated on validation")}
    long_kind = "attention_keys" in names  # its own key layout, named by attention_keys
    for name in names[2:]:
        if name.startswith("attention."):
            layouts[name] = ("B × H × L × K: query rows over the K columns attention_keys names (predict.py "
                             "--attention --all-heads)" if long_kind else
                             "B × H × L × L: query rows, key columns, each real row sums to 1 over the real keys")
        elif name == "attention_keys":
            layouts[name] = "L × K int64: the token of column c in row i; -1 for a projected (linformer) key"
        else:
            layouts[name] = "B × H × g × L: the g global tokens' rows over all L keys (sparse)"
    return {
        "labels": classifier.label_names,
        "multi_label": classifier.multi_label,
        "temperature": classifier.temperature,
        "thresholds": classifier.thresholds if classifier.multi_label else None,
        "max_length": classifier.max_length,
        "attention": config.attention,
        "inputs": {"input_ids": "int64 B × L token ids from tokenizer.json, L ≤ max_length",
                   "attention_mask": "int64 B × L: 1 for a real token, 0 for padding"},
        "outputs": layouts,
        "padding": {"side": "right", "pad_id": PAD_ID, "pad_token": PAD,
                    "rule": "the mask comes from each text's length (tokenizer.json's attention_mask), never from "
                            "matching ids: a [PAD] typed in a text is a real token; rows of a padded query are not "
                            "meaningful"},
        "tokenizer": {"file": "tokenizer.json", "truncation": f"the first {classifier.max_length} tokens",
                      "steps_outside": [
                          f"an empty encoding (a text of characters the normalizer drops) is one {UNK} (id {UNK_ID})",
                          f"the project cuts a text to max_length × {CHARS_PER_TOKEN_BOUND} characters before "
                          "tokenizing; it changes the ids only for a text whose first max_length tokens are longer",
                          "an empty or whitespace-only text is an error in predict.py, not a prediction"]},
        "attention_formula": "softmax(Q Kᵀ / √d + mask) V, written out (MatMul, Softmax, MatMul), not a fused op",
        "network": config.to_dict(),
        "checkpoint": checkpoint_name,
        "opset": OPSET,
    }


class ExportError(ValueError):
    pass


def main(argv=None) -> int:
    args = parse_args(argv)
    runtime.configure()  # before torch loads: runtime.py
    notes_to_stderr(log)
    return run_face(run, args)  # CheckpointError, ExportError, WriteError: one line


def run(args) -> int:
    from data.files import check_target, make_folder, write_text
    from inference import TextClassifier
    from inference.classifier import FACE_FLAGS
    from data.checkpoint import open_checkpoint

    for module in ("onnx", "onnxscript"):  # torch.onnx.export needs both: say so, not that the kind cannot export
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            raise ExportError(f"export.py needs the export extra ({e.name} is not installed): "
                              'pip install -e ".[export]"') from None
    ckpt, checkpoint = open_checkpoint(args.ckpt)
    classifier = TextClassifier.from_checkpoint(ckpt, device="cpu", checkpoint=checkpoint,
                                                attention=args.attention_class,
                                                allow_changed=args.allow_changed_class, flags=FACE_FLAGS)
    made = not Path(args.out).exists()
    out = make_folder(args.out, "export folder")
    for name in ("model.onnx", "tokenizer.json", "config.json"):
        check_target(out / name, name, inputs=[ckpt])
    names = output_names(classifier, args.attention)
    try:
        export_onnx(classifier, out / "model.onnx", names)
    except ExportError:
        if made and not any(out.iterdir()):
            out.rmdir()  # a failed export leaves no empty folder it made behind
        raise
    tokenizer = export_tokenizer(classifier, classifier.max_length)
    write_text(out / "tokenizer.json", tokenizer.to_str(pretty=True), what="tokenizer")
    config = export_config(classifier, ckpt.name, names)
    write_text(out / "config.json", json.dumps(config, ensure_ascii=False, indent=2, allow_nan=False) + "\n", what="config")
    log.info("exported %s (%s attention%s) to %s: model.onnx, tokenizer.json, config.json", ckpt,
             classifier.model.config.attention, ", with its weights as outputs" if args.attention else "", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
