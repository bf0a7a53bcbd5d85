"""onnxruntime against PyTorch: throughput on a checkpoint, and the largest differences of an export.

    python -m bench.timing onnx --ckpt lightning_logs/version_0    # SST-2 validation texts, 1 thread each
    python -m bench.timing onnx --kinds                            # tiny random model of every attention kind

--ckpt exports the checkpoint (export.py, without and with --attention) to a temporary folder, then classifies the
dataset's validation texts (default SST-2) both ways with the same batching (sorted by length, batches of
--batch-size) and the same thread count: PyTorch through TextClassifier.predict, onnxruntime through tokenizer.json
and model.onnx, tokenization included in both. Prints texts/s for each, the largest |Δ probability| and whether every
label agrees. --kinds exports a tiny random network of each registered kind (model/kinds.py) with --attention and
prints the largest |Δ| of probabilities and of attention weights against PyTorch on a padded batch. The last line of
stdout is one JSON object with every figure.
"""

import json
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from inference.limits import PREDICT_BATCH

log = logging.getLogger("bench.onnx_speed")


THREADS = 1  # torch's and onnxruntime's, the same for both sides


def add_arguments(parser):
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--ckpt", help="checkpoint (or run folder) to export and time")
    what.add_argument("--kinds", action="store_true", help="largest differences for a tiny model of every kind")
    parser.add_argument("--dataset", default="sst2", help="validation texts of this registered dataset")
    parser.add_argument("--batch-size", type=int, default=PREDICT_BATCH, help="texts per forward pass (predict.py's)")
    parser.add_argument("--repeats", type=int, default=3, help="passes over the texts; the best is kept")


def session(path: Path, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_probabilities(folder: Path, texts: list[str], batch_size: int, threads: int) -> np.ndarray:
    """Probabilities (N, C) in text order through tokenizer.json and model.onnx, in length-sorted batches."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    run = session(folder / "model.onnx", threads)
    tokenizer.no_padding()
    lengths = [len(e.ids) for e in tokenizer.encode_batch(texts)]
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    order = sorted(range(len(texts)), key=lengths.__getitem__)
    probabilities = np.zeros((len(texts), 0), dtype=np.float32)
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        encodings = tokenizer.encode_batch([texts[i] for i in batch])
        feed = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64)}
        logits = run.run(["logits"], feed)[0]
        if probabilities.shape[1] == 0:
            probabilities = np.zeros((len(texts), logits.shape[1]), dtype=np.float32)
        probabilities[batch] = torch.tensor(logits).softmax(-1).numpy()
    return probabilities


def best_of(repeats: int, work) -> tuple[float, object]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = work()
        best = min(best, time.perf_counter() - started)
    return best, result


def throughput(args) -> dict:
    import export
    from data.reading import has_text
    from data.sources import load_splits
    from inference import TextClassifier

    splits = load_splits(dataset=args.dataset, data_dir=None, train_file=None, val_file=None, test_file=None,
                         text_column=None, label_column=None, val_fraction=0.1, seed=0)
    texts = [text for text in splits.texts["validation"] if has_text(text)]
    classifier = TextClassifier.from_checkpoint(args.ckpt, device="cpu")
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        started = time.perf_counter()
        assert export.main(["--ckpt", args.ckpt, "--out", str(folder)]) == 0
        export_s = time.perf_counter() - started
        torch_s, predictions = best_of(args.repeats, lambda: classifier.predict(texts, batch_size=args.batch_size))
        onnx_s, probabilities = best_of(args.repeats, lambda: onnx_probabilities(folder, texts, args.batch_size,
                                                                                 args.threads))
    expected = np.array([[p.probabilities[name] for name in classifier.label_names] for p in predictions])
    return {"texts": len(texts), "dataset": args.dataset, "threads": args.threads, "batch_size": args.batch_size,
            "export_s": round(export_s, 1), "pytorch_texts_per_s": round(len(texts) / torch_s, 1),
            "onnxruntime_texts_per_s": round(len(texts) / onnx_s, 1),
            "max_abs_probability_difference": float(np.abs(probabilities - expected).max()),
            "labels_agree": bool((probabilities.argmax(1) == expected.argmax(1)).all())}


SMALL_KINDS = dict(window=2, global_tokens=1, projection_length=4)  # each kind reads the settings it takes
WORDS = [f"w{i}" for i in range(20)] + ["alpha", "beta", "好", "差"]
KIND_TEXTS = ["w1 alpha w2 beta w3 w4 w5 w6 w7", "beta 好 差", "alpha", "w3 [PAD] w4 zzz", "w8 w9 w10 w11 w12 w13"]


def tiny_checkpoint(kind: str, path: Path):
    """A random 2-layer network of the kind with a word tokenizer, saved in train.py's checkpoint layout."""
    import random

    from data.tokenizer import stored_form, train_tokenizer
    from inference import TextClassifier
    from model import AttentionClassifier, NetworkConfig

    rng = random.Random(0)
    tokenizer = train_tokenizer([" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(200)], vocab_size=64,
                                max_length=12, kind="word")
    torch.manual_seed(0)
    config = NetworkConfig(vocab_size=64, num_classes=2, max_length=12, d_model=16, n_heads=2, n_layers=2, d_ff=32,
                           attention=kind, **SMALL_KINDS)
    classifier = TextClassifier(AttentionClassifier(config), tokenizer, ["neg", "pos"], device="cpu")
    torch.save({"state_dict": {f"model.{k}": v for k, v in classifier.model.state_dict().items()},
                "hyper_parameters": {"network": config.to_dict(), "label_names": ["neg", "pos"]},
                "TextDataModule": {"tokenizer": stored_form(tokenizer.to_str())}},
               path)
    return classifier


def kinds() -> dict:
    import export
    from tokenizers import Tokenizer

    from model.kinds import ATTENTION_KINDS

    figures = {}
    with tempfile.TemporaryDirectory() as folder:
        for kind in ATTENTION_KINDS:
            out, ckpt = Path(folder) / kind, Path(folder) / f"{kind}.ckpt"
            classifier = tiny_checkpoint(kind, ckpt)
            assert export.main(["--ckpt", str(ckpt), "--out", str(out), "--attention"]) == 0
            labels = json.loads((out / "config.json").read_text())["labels"]
            encodings = Tokenizer.from_file(str(out / "tokenizer.json")).encode_batch(KIND_TEXTS)
            feed = {"input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
                    "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64)}
            run = session(out / "model.onnx", 1)
            outputs = dict(zip([o.name for o in run.get_outputs()], run.run(None, feed)))
            predictions = classifier.predict(KIND_TEXTS, attention=True)
            probabilities = torch.tensor(outputs["logits"]).softmax(-1).numpy()
            probability, weight = 0.0, 0.0
            for row, prediction in enumerate(predictions):
                n = sum(encodings[row].attention_mask)
                expected = [prediction.probabilities[name] for name in labels]
                probability = max(probability, float(np.abs(probabilities[row] - expected).max()))
                for layer in range(classifier.model.config.n_layers):
                    got = outputs[f"attention.{layer}"][row, :, :n]
                    got = got[..., :n] if prediction.attention_keys is None else got  # columns are tokens
                    weight = max(weight, float(np.abs(got - prediction.attention[layer].numpy()).max()))
            figures[kind] = {"max_abs_probability_difference": probability, "max_abs_weight_difference": weight}
    return figures


def run(args) -> tuple[str, dict]:
    logging.getLogger().setLevel(logging.WARNING)  # the exporter's graph passes log every step at INFO
    if args.kinds:
        figures = kinds()
        return "\n".join(f"{kind:10s} max |Δ probability| {f['max_abs_probability_difference']:.2e}   "
                         f"max |Δ attention weight| {f['max_abs_weight_difference']:.2e}"
                         for kind, f in figures.items()), figures
    figures = throughput(args)
    return (f"{figures['texts']} {figures['dataset']} validation texts, batches of {figures['batch_size']}, "
            f"{figures['threads']} thread(s): PyTorch {figures['pytorch_texts_per_s']} texts/s, onnxruntime "
            f"{figures['onnxruntime_texts_per_s']} texts/s; max |Δ probability| "
            f"{figures['max_abs_probability_difference']:.2e}, labels agree: {figures['labels_agree']}"), figures
