"""Speed and memory of this project's AttentionClassifier against a torch.nn.TransformerEncoder peer of the same shape.

Both models get the very same batches: SST-2-like sentence lengths (drawn from the SST-2 train length histogram,
padded per batch to the batch's longest sentence) and synthetic batches at fixed lengths without padding.
The peer runs as a user would run it, with default settings: in eval mode under torch.inference_mode it takes
PyTorch's fast path (fused native kernels, nested tensors that skip the padding). This project's classifier
leaves padding out of its per-token work whenever it needs no attention weights (model/classifier.py).
A second table times the attention operation alone, forward + backward. Runs alternate (A B A B …) after a
warm-up and each figure is the median of the repeats, so background load hits both sides alike.
Ratios are this project ÷ peer: for speed, above 1 means this project is faster; for memory, above 1 means
this project needs more.

    python bench/speed.py            # the default run, a few minutes on 2 CPU cores
    python bench/speed.py --quick    # under a minute on 2 CPU cores
    python bench/speed.py --smoke    # a few seconds, tiny model: only checks that the bench runs

The last line of stdout is one JSON object holding every ratio and throughput.
"""

import argparse
import json
import logging
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from model.attention import MultiHeadSelfAttention
from model.classifier import POOLINGS, AttentionClassifier, AttentionPooling, ClassifierOutput

log = logging.getLogger("bench.speed")

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "sst2.yaml"

# How many SST-2 train sentences have 1, 2, …, 52 whitespace tokens (all 67,349 of them; median 7, p90 21, max 52).
SST2_LENGTH_COUNTS = [
    4270, 7241, 7031, 5511, 4578, 4019, 3594, 3092, 2861, 2564, 2230, 2051, 1830, 1748, 1560, 1388, 1265, 1182,
    1040, 922, 860, 820, 741, 654, 572, 505, 460, 416, 335, 297, 281, 253, 226, 166, 152, 108, 90, 91, 60, 55,
    53, 34, 30, 24, 27, 17, 9, 11, 9, 7, 6, 3,
]


@dataclass
class Shape:
    """The network both sides build; defaults are those of configs/sst2.yaml when it has none."""

    vocab_size: int = 8000
    num_classes: int = 2
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256
    pooling: str = "mean"
    dropout: float = 0.1
    attention_dropout: float = 0.0


@dataclass
class Plan:
    """How much work each measurement does."""

    warmup: int
    repeats: int
    train_batch: int  # sentences per training step at SST-2 lengths (and at the shortest fixed length)
    inference_batch: int
    train_steps: int  # steps per timed call
    inference_steps: int
    fixed_lengths: tuple[int, ...]
    attention_lengths: tuple[int, ...]
    attention_tokens: int  # batch × length for the attention-only runs, so long sequences stay quick


PLANS = {
    "default": Plan(warmup=2, repeats=7, train_batch=64, inference_batch=256, train_steps=8, inference_steps=4,
                    fixed_lengths=(32, 128, 512), attention_lengths=(32, 128, 512, 2048), attention_tokens=4096),
    "quick": Plan(warmup=1, repeats=3, train_batch=64, inference_batch=256, train_steps=2, inference_steps=2,
                  fixed_lengths=(32, 128, 512), attention_lengths=(32, 128, 512, 2048), attention_tokens=2048),
    "smoke": Plan(warmup=1, repeats=1, train_batch=8, inference_batch=16, train_steps=1, inference_steps=1,
                  fixed_lengths=(8, 16), attention_lengths=(8, 16), attention_tokens=64),
}
SMOKE_SHAPE = Shape(vocab_size=100, d_model=16, n_heads=2, n_layers=1, d_ff=32)


class TransformerEncoderClassifier(nn.Module):
    """The peer: the same embeddings, pooling and head around torch.nn.TransformerEncoder (post-LN, GELU)."""

    pool = AttentionClassifier.pool  # the very same pooling code, so only the encoder differs

    def __init__(self, shape: Shape, max_length: int):
        super().__init__()
        self.pooling = shape.pooling
        self.token_embedding = nn.Embedding(shape.vocab_size, shape.d_model, padding_idx=0)
        self.position_embedding = nn.Embedding(max_length, shape.d_model)
        self.embedding_dropout = nn.Dropout(shape.dropout)
        layer = nn.TransformerEncoderLayer(
            shape.d_model, shape.n_heads, dim_feedforward=shape.d_ff, dropout=shape.dropout, activation="gelu",
            batch_first=True,
        )
        # TransformerEncoderLayer drops attention weights at `dropout`; ours has its own rate, so match it.
        layer.self_attn.dropout = shape.attention_dropout
        self.encoder = nn.TransformerEncoder(layer, shape.n_layers)  # default settings: fast path, nested tensors
        self.attention_pool = AttentionPooling(shape.d_model) if shape.pooling == "attention" else None
        self.head = nn.Linear(shape.d_model, shape.num_classes)

    def forward(self, token_ids, key_padding_mask=None):
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        x = self.embedding_dropout(self.token_embedding(token_ids) + self.position_embedding(positions))
        x = self.encoder(x, src_key_padding_mask=key_padding_mask)
        return ClassifierOutput(self.head(self.pool(x, key_padding_mask)), None)


def build_models(shape: Shape, max_length: int, device) -> dict[str, nn.Module]:
    ours = AttentionClassifier(
        vocab_size=shape.vocab_size, num_classes=shape.num_classes, d_model=shape.d_model, n_heads=shape.n_heads,
        n_layers=shape.n_layers, d_ff=shape.d_ff, max_length=max_length, dropout=shape.dropout,
        embedding_dropout=shape.dropout, attention_dropout=shape.attention_dropout, pooling=shape.pooling,
    )
    return {"ours": ours.to(device), "peer": TransformerEncoderClassifier(shape, max_length).to(device)}


def make_batch(lengths, vocab_size: int, num_classes: int, generator, device, pad: bool = True):
    """Token ids (B, L) padded with 0 to the longest length, padding mask (B, L) or None, labels (B,)."""
    lengths = torch.as_tensor(lengths)
    L = int(lengths.max())
    token_ids = torch.randint(1, vocab_size, (len(lengths), L), generator=generator)
    mask = torch.arange(L)[None, :] >= lengths[:, None]  # (B, L), True = padding
    token_ids = token_ids.masked_fill(mask, 0)
    labels = torch.randint(0, num_classes, (len(lengths),), generator=generator)
    return token_ids.to(device), mask.to(device) if pad else None, labels.to(device)


def sst2_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    counts = np.array(SST2_LENGTH_COUNTS)
    return rng.choice(np.arange(1, len(counts) + 1), size=n, p=counts / counts.sum())


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def alternate(runs: dict, *, warmup: int, repeats: int, device) -> dict[str, float]:
    """Median seconds per call of each run, calling them in turn (A B A B …) so background load hits all alike."""
    for _ in range(warmup):
        for run in runs.values():
            run()
    seconds = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            sync(device)
            start = time.perf_counter()
            run()
            sync(device)
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in seconds.items()}


def peak_memory(run, device) -> int:
    """Peak bytes of tensors allocated during one call and alive at the same time.

    On CUDA: torch.cuda.max_memory_allocated above what was allocated at the start. On CPU: the profiler's record
    of every allocation and free made through PyTorch's CPU allocator during the call, summed in time order
    (tensor bytes, not the process's resident memory; frees of tensors made before the call are not counted).
    """
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated(device) - before
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    events = prof.profiler.kineto_results.events()
    changes = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    live = peak = 0
    for _, nbytes in changes:
        live += nbytes
        peak = max(peak, live)
    return peak


def train(model, optimizer, batches):
    """Forward + backward + AdamW step on each batch."""
    model.train()
    for token_ids, mask, labels in batches:
        loss = F.cross_entropy(model(token_ids, mask).logits, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def infer(model, batches):
    model.eval()
    with torch.inference_mode():
        for token_ids, mask, _ in batches:
            model(token_ids, mask)


def compare_classifiers(models, workload, train_batches, inference_batches, plan, device) -> list[dict]:
    """Training samples/s and inference sentences/s of both models on the same batches: one row per task."""
    optimizers = {side: torch.optim.AdamW(model.parameters(), lr=1e-3) for side, model in models.items()}
    tasks = {
        "train": (train_batches, lambda side, batches: train(models[side], optimizers[side], batches)),
        "inference": (inference_batches, lambda side, batches: infer(models[side], batches)),
    }
    rows = []
    for task, (batches, run) in tasks.items():
        seconds = alternate({side: partial(run, side, batches) for side in models}, warmup=plan.warmup,
                            repeats=plan.repeats, device=device)
        # One step on the longest batch, after the timed runs so that the optimizer state already exists.
        longest = [max(batches, key=lambda batch: batch[0].numel())]
        memory = {side: peak_memory(partial(run, side, longest), device) for side in models}
        sentences = sum(len(labels) for _, _, labels in batches)
        rows.append(dict(
            workload=workload, task=task, batch=len(batches[0][2]),
            tokens=sum(ids.numel() for ids, _, _ in batches) // len(batches),
            real=sum(int((ids != 0).sum()) for ids, _, _ in batches) // len(batches),
            ours=sentences / seconds["ours"], peer=sentences / seconds["peer"],
            speed_ratio=seconds["peer"] / seconds["ours"], ours_mb=memory["ours"] / 2**20,
            peer_mb=memory["peer"] / 2**20, memory_ratio=memory["ours"] / max(memory["peer"], 1),
        ))
        log.info("%s %s: %.2fx", workload, task, rows[-1]["speed_ratio"])
    return rows


def compare_attention(shape, L, plan, device, generator) -> dict:
    """The attention operation alone, forward + backward, on B sequences of L tokens, a quarter of them padded."""
    B = max(1, plan.attention_tokens // L)
    torch.manual_seed(0)
    layer = MultiHeadSelfAttention(d_model=shape.d_model, n_heads=shape.n_heads).to(device)
    x = torch.randn(B, L, shape.d_model, device=device, requires_grad=True)
    lengths = torch.randint(L // 2 + 1, L + 1, (B,), generator=generator)
    lengths[0] = L
    mask = (torch.arange(L)[None, :] >= lengths[:, None]).to(device)  # (B, L), True = padding

    def explicit():
        layer(x, key_padding_mask=mask, need_weights=True)[0].sum().backward()

    def fused():
        layer(x, key_padding_mask=mask, need_weights=False)[0].sum().backward()

    def sdpa():
        # The bare kernel between the same four projections, written the obvious way.
        q, k, v = (layer.split_heads(w(x)) for w in (layer.w_q, layer.w_k, layer.w_v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask[:, None, None, :])
        layer.w_o(layer.merge_heads(out)).sum().backward()

    runs = {"explicit": explicit, "fused": fused, "sdpa": sdpa}
    seconds = alternate(runs, warmup=plan.warmup, repeats=plan.repeats, device=device)
    memory = {name: peak_memory(run, device) for name, run in runs.items()}
    row = dict(L=L, batch=B, explicit_ratio=seconds["sdpa"] / seconds["explicit"],
               fused_ratio=seconds["sdpa"] / seconds["fused"])
    for name in runs:
        row[f"{name}_ms"], row[f"{name}_mb"] = seconds[name] * 1e3, memory[name] / 2**20
    log.info("attention L=%d: explicit %.2fx, fused %.2fx", L, row["explicit_ratio"], row["fused_ratio"])
    return row


def print_tables(classifier_rows, attention_rows):
    print("\nClassifier: this project (ours) vs nn.TransformerEncoder peer, sentences/s;"
          " speed = ours ÷ peer (>1: ours faster), mem = peak MB ours ÷ peer")
    print(f"{'workload':<10}{'task':<11}{'batch':>6}{'tokens':>8}{'real':>7}{'ours/s':>9}{'peer/s':>9}{'speed':>8}"
          f"{'ours MB':>9}{'peer MB':>9}{'mem':>7}")
    for r in classifier_rows:
        print(f"{r['workload']:<10}{r['task']:<11}{r['batch']:>6}{r['tokens']:>8}{r['real']:>7}{r['ours']:>9.0f}"
              f"{r['peer']:>9.0f}{r['speed_ratio']:>7.2f}x{r['ours_mb']:>9.1f}{r['peer_mb']:>9.1f}"
              f"{r['memory_ratio']:>6.2f}x")
    print("\nAttention alone, forward + backward, the four projections included (sdpa: the bare kernel between"
          " them);\nspeed = sdpa time ÷ path time (>1: faster than the bare kernel)")
    print(f"{'L':>6}{'batch':>6}{'explicit ms':>13}{'fused ms':>10}{'sdpa ms':>9}{'explicit':>10}{'fused':>7}"
          f"{'expl MB':>9}{'fused MB':>9}{'sdpa MB':>9}")
    for r in attention_rows:
        print(f"{r['L']:>6}{r['batch']:>6}{r['explicit_ms']:>13.2f}{r['fused_ms']:>10.2f}{r['sdpa_ms']:>9.2f}"
              f"{r['explicit_ratio']:>9.2f}x{r['fused_ratio']:>6.2f}x"
              f"{r['explicit_mb']:>9.1f}{r['fused_mb']:>9.1f}{r['sdpa_mb']:>9.1f}")


def summary(classifier_rows, attention_rows, shape, device) -> dict:
    result = {}
    for r in classifier_rows:
        suffix = "" if r["workload"] == "sst2" else "_" + r["workload"]
        result[f"{r['task']}_speed_ratio{suffix}"] = round(r["speed_ratio"], 3)
        result[f"{r['task']}_memory_ratio{suffix}"] = round(r["memory_ratio"], 3)
        result[f"{r['task']}_samples_per_s{suffix}"] = {"ours": round(r["ours"], 1), "peer": round(r["peer"], 1)}
    for r in attention_rows:
        result[f"attention_explicit_vs_sdpa_L{r['L']}"] = round(r["explicit_ratio"], 3)
        result[f"attention_fused_vs_sdpa_L{r['L']}"] = round(r["fused_ratio"], 3)
    result.update(device=str(device), torch=torch.__version__, threads=torch.get_num_threads(), shape=asdict(shape))
    return result


def load_shape(path: Path) -> Shape:
    shape = Shape()
    if path.exists():
        config = yaml.safe_load(path.read_text()) or {}
        model, data = config.get("model") or {}, config.get("data") or {}
        for key in ("d_model", "n_heads", "n_layers", "d_ff", "pooling", "dropout", "attention_dropout"):
            if key in model:
                setattr(shape, key, type(getattr(shape, key))(model[key]))
        if "vocab_size" in data:
            shape.vocab_size = int(data["vocab_size"])
    return shape


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer repeats and steps: under a minute on 2 CPU cores")
    size.add_argument("--smoke", action="store_true", help="tiny model and lengths, one repeat: a few seconds")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto", help="auto = cuda if available")
    parser.add_argument("--config", type=Path, default=CONFIG,
                        help="take the shape from its model: keys and data.vocab_size, if it exists (%(default)s)")
    for key in ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size"):
        parser.add_argument("--" + key.replace("_", "-"), type=int, help=f"override the config's {key}")
    parser.add_argument("--pooling", choices=POOLINGS, help="override the config's pooling")
    parser.add_argument("--repeats", type=int, help="timed repeats per measurement (median is reported)")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice, one per core); "
                        "with other jobs on the cores, 1 avoids threads waiting on each other")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # The peer's fast path warns that nested tensors are a prototype; that is how it runs by default.
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    plan = PLANS["smoke" if args.smoke else "quick" if args.quick else "default"]
    if args.repeats:
        plan = replace(plan, repeats=args.repeats)
    shape = SMOKE_SHAPE if args.smoke else load_shape(args.config)
    for key in ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size", "pooling"):
        if getattr(args, key) is not None:
            setattr(shape, key, getattr(args, key))
    if shape.d_ff < 1:
        raise SystemExit("the peer (nn.TransformerEncoderLayer) always has a feed-forward: pass --d-ff N with N > 0")
    log.info("device %s, torch %s, %d threads, shape %s", device, torch.__version__, torch.get_num_threads(), shape)

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    models = build_models(shape, max(max(plan.fixed_lengths), len(SST2_LENGTH_COUNTS)), device)

    def batches(size, steps, lengths=None):
        return [make_batch(sst2_lengths(rng, size) if lengths is None else [lengths] * size, shape.vocab_size,
                           shape.num_classes, generator, device, pad=lengths is None) for _ in range(steps)]

    rows = compare_classifiers(models, "sst2", batches(plan.train_batch, plan.train_steps),
                               batches(plan.inference_batch, plan.inference_steps), plan, device)
    shortest = min(plan.fixed_lengths)
    for L in plan.fixed_lengths:
        # Fewer sentences as they grow longer, so every step holds about as many tokens as at the shortest length.
        train_batch, inference_batch = (max(1, n * shortest // L) for n in (plan.train_batch, plan.inference_batch))
        rows += compare_classifiers(models, f"L{L}", batches(train_batch, plan.train_steps, L),
                                    batches(inference_batch, plan.inference_steps, L), plan, device)
    attention_rows = [compare_attention(shape, L, plan, device, generator) for L in plan.attention_lengths]

    print_tables(rows, attention_rows)
    print(json.dumps(summary(rows, attention_rows, shape, device)))


if __name__ == "__main__":
    main()
