"""How fast predictions are: batch throughput, single-text latency, and predict.py start-up.

    python -m bench.timing predict                   # a model shaped like configs/sst2.yaml, random weights
    python -m bench.timing predict --ckpt last.ckpt  # a trained checkpoint instead
    python -m bench.timing predict --smoke           # a few seconds: only checks that the bench runs

Texts are the 872 SST-2 validation sentences when $ATTENTION_DATA_ROOT/sst2/validation.tsv exists (else
synthetic sentences of SST-2-like lengths). Without --ckpt, a checkpoint laid out as train.py writes it is built:
the config's tokenizer (data.tokenizer.train_tokenizer with its data: settings) trained on those sentences, and an
AttentionClassifier built from its NetworkConfig (model.network, data.vocab_size, data.max_length) with random
weights (speed does not depend on the weights). Throughput and latency go through `TextClassifier.predict`,
tokenization included, with torch's default thread count unless --threads; start-up is the wall time of a whole
`python predict.py --ckpt ... TEXT` process. The last line of stdout is one JSON object with every figure.
"""

import csv
import logging
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench.common import CONFIGS, ROOT, network_config, read_config
from data.tokenizer import stored_form, train_tokenizer
from inference import TextClassifier
from inference.limits import PREDICT_BATCH
from model import AttentionClassifier

log = logging.getLogger("bench.predict_speed")
CONFIG = CONFIGS / "sst2.yaml"
SMOKE_NETWORK = {"d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 0}


def sst2_sentences() -> list[str]:
    root = os.environ.get("ATTENTION_DATA_ROOT", str(ROOT.parent / "shared" / "data"))
    path = Path(root) / "sst2" / "validation.tsv"
    if path.exists():
        with open(path, newline="", encoding="utf-8") as f:
            sentences = [row["sentence"].strip() for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
        log.info("texts: %d SST-2 validation sentences from %s", len(sentences), path)
        return sentences
    rng = random.Random(0)
    words = [f"word{i}" for i in range(2000)]
    sentences = [" ".join(rng.choices(words, k=max(1, int(rng.lognormvariate(2.2, 0.7))))) for _ in range(872)]
    log.info("texts: %d synthetic sentences (no %s)", len(sentences), path)
    return sentences


def random_checkpoint(path: Path, texts: list[str], smoke: bool) -> Path:
    """A checkpoint as train.py lays it out, for the network of configs/sst2.yaml (tiny with smoke)."""
    data = read_config(CONFIG)["data"]
    tokenizer = train_tokenizer(
        texts, vocab_size=data["vocab_size"], max_length=data["max_length"], kind=data.get("tokenizer", "wordpiece"),
        split_cjk=data.get("split_cjk", True), split_punctuation=data.get("split_punctuation", True),
    )
    label_names = ["negative", "positive"]
    network = network_config(CONFIG, **(SMOKE_NETWORK if smoke else {}), vocab_size=tokenizer.get_vocab_size(),
                             num_classes=len(label_names))
    torch.manual_seed(0)
    model = AttentionClassifier(network)
    torch.save(
        {
            "state_dict": {f"model.{key}": value for key, value in model.state_dict().items()},
            "hyper_parameters": {"network": network.to_dict(), "label_names": label_names},
            "TextDataModule": {"tokenizer": stored_form(tokenizer.to_str())},  # the layout train.py writes
        },
        path,
    )
    log.info("random-weight checkpoint %s: %s", path, network)
    return path


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def add_arguments(parser):
    parser.add_argument("--ckpt", help="a trained checkpoint (default: random weights, shaped like configs/sst2.yaml)")
    parser.add_argument("--batch-size", type=int, default=PREDICT_BATCH, help="texts per forward pass (predict.py's)")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes over all texts; the median is reported")
    parser.add_argument("--latency-calls", type=int, default=100)
    parser.add_argument("--startup-runs", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="tiny model, few repeats: checks that the bench runs")


def run(args) -> tuple[str, dict]:
    if args.smoke:
        args.repeats, args.latency_calls, args.startup_runs = 1, 5, 1

    texts = sst2_sentences()
    with tempfile.TemporaryDirectory() as folder:
        ckpt = Path(args.ckpt) if args.ckpt else random_checkpoint(Path(folder) / "random.ckpt", texts, args.smoke)
        classifier = TextClassifier.from_checkpoint(ckpt, device="cpu")
        classifier.predict(texts, batch_size=args.batch_size)  # warm-up
        seconds = statistics.median(
            timed(lambda: classifier.predict(texts, batch_size=args.batch_size)) for _ in range(args.repeats)
        )
        # One text of median length, as a single user request would be.
        single = sorted(texts, key=len)[len(texts) // 2]
        for _ in range(5):
            classifier.predict([single])
        latency = statistics.median(timed(lambda: classifier.predict([single])) for _ in range(args.latency_calls))
        command = [sys.executable, str(ROOT / "predict.py"), "--ckpt", str(ckpt), "--device", "cpu", single]
        startup = statistics.median(
            timed(lambda: subprocess.run(command, check=True, capture_output=True)) for _ in range(args.startup_runs)
        )

    figures = {
        "texts": len(texts),
        "batch_size": args.batch_size,
        "sentences_per_s": round(len(texts) / seconds, 1),
        "single_text_latency_ms": round(latency * 1000, 2),
        "predict_py_startup_s": round(startup, 3),
    }
    table = "\n".join([
        f"batch inference:     {figures['sentences_per_s']:10.1f} sentences/s  ({len(texts)} texts, batch "
        f"{args.batch_size}, {torch.get_num_threads()} torch threads, median of {args.repeats})",
        f"single-text latency: {figures['single_text_latency_ms']:10.2f} ms  (median of {args.latency_calls} warm calls)",
        f"predict.py start-up: {figures['predict_py_startup_s']:10.3f} s   (one text, whole process, "
        f"median of {args.startup_runs})",
    ])
    return table, figures
