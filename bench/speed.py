"""Speed and memory of this project's AttentionClassifier, with each of its two attention kernels, against a
torch.nn.TransformerEncoder peer of the same shape.

Both sides are built from one NetworkConfig (model/config.py): the `model: network:` section of configs/sst2.yaml
with data.vocab_size, as train.py would build it. This project runs twice, with attention_kernel "manual" (the
default: the written lines of model.attention.attention()) and "fused" (the opt-in: torch's
scaled_dot_product_attention); the two share their weights.

Every side gets the very same batches: SST-2-like sentence lengths (drawn from the SST-2 train length histogram,
padded per batch to the batch's longest sentence) and synthetic batches at fixed lengths without padding.
The peer runs as a user would run it, with default settings: in eval mode under torch.inference_mode it takes
PyTorch's fast path (fused native kernels, nested tensors that skip the padding). This project's classifier
always leaves padding out of its per-token work (model/classifier.py). A second table times the attention layer
alone, forward + backward. Runs alternate (A B C A B C …) after a warm-up and each figure is the median of the
repeats, so background load hits every side alike. Ratios are this project ÷ peer: for speed (throughput ÷
throughput), above 1 means this project is faster; for memory, above 1 means this project needs more.

    python -m bench.timing speed            # the default run, a few minutes on 2 CPU cores
    python -m bench.timing speed --quick    # about a minute on 2 CPU cores
    python -m bench.timing speed --smoke    # a few seconds, tiny model: only checks that the bench runs

The tables go to stderr; the last line of stdout is one JSON object holding every ratio and throughput.
"""

import argparse
import json
import logging
import statistics
import time
import warnings
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bench.common import CONFIGS, network_config
from data.tokenizer import PAD_ID, UNK_ID, padding_mask
from model.attention import MultiHeadSelfAttention
from model.classifier import AttentionClassifier, AttentionPooling, ClassifierOutput, position_embedding
from model.config import KERNELS, POOLINGS, ConfigError, NetworkConfig

log = logging.getLogger("bench.speed")

CONFIG = CONFIGS / "sst2.yaml"
SIDES = (*KERNELS, "peer")  # manual, fused: this project with either kernel; peer: nn.TransformerEncoder

# How many SST-2 train sentences have 1, 2, …, 52 whitespace tokens (all 67,349 of them; median 7, p90 21, max 52).
SST2_LENGTH_COUNTS = [
    4270, 7241, 7031, 5511, 4578, 4019, 3594, 3092, 2861, 2564, 2230, 2051, 1830, 1748, 1560, 1388, 1265, 1182,
    1040, 922, 860, 820, 741, 654, 572, 505, 460, 416, 335, 297, 281, 253, 226, 166, 152, 108, 90, 91, 60, 55,
    53, 34, 30, 24, 27, 17, 9, 11, 9, 7, 6, 3,
]


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
SMOKE_NETWORK = NetworkConfig(vocab_size=100, d_model=16, n_heads=2, n_layers=1, d_ff=32)


class TransformerEncoderClassifier(nn.Module):
    """The peer: the same embeddings, pooling and head around torch.nn.TransformerEncoder (post-LN, GELU)."""

    pool = AttentionClassifier.pool  # the very same pooling code, so only the encoder differs

    def __init__(self, config: NetworkConfig):
        super().__init__()
        if config.head_size * config.n_heads != config.d_model:
            raise ConfigError(f"the peer's heads split d_model: d_head {config.d_head} must be d_model // n_heads")
        if config.d_ff < 1:
            raise ConfigError("the peer (nn.TransformerEncoderLayer) always has a feed-forward: d_ff must be > 0")
        if config.causal:
            raise ConfigError("the bench compares bidirectional encoders: causal must be false")
        self.config = config
        self.token_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.position_embedding = position_embedding(config.positions, config.max_length, config.d_model)
        self.embedding_norm = nn.LayerNorm(config.d_model) if config.embedding_norm else None  # as ours has
        self.embedding_dropout = nn.Dropout(config.embedding_dropout)
        layer = nn.TransformerEncoderLayer(
            config.d_model, config.n_heads, dim_feedforward=config.d_ff, dropout=config.dropout, activation="gelu",
            batch_first=True,
        )
        # TransformerEncoderLayer drops attention weights at `dropout`; ours has its own rate, so match it.
        layer.self_attn.dropout = config.attention_dropout
        self.encoder = nn.TransformerEncoder(layer, config.n_layers)  # default settings: fast path, nested tensors
        self.attention_pool = AttentionPooling(config.d_model) if config.pooling == "attention" else None
        self.head_dropout = nn.Dropout(config.head_dropout)
        self.head = nn.Linear(config.d_model, config.num_classes)

    def forward(self, token_ids, key_padding_mask=None):
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        x = self.token_embedding(token_ids) + self.position_embedding(positions)
        x = self.embedding_dropout(x if self.embedding_norm is None else self.embedding_norm(x))
        x = self.encoder(x, src_key_padding_mask=key_padding_mask)
        if key_padding_mask is None:
            key_padding_mask = torch.zeros(token_ids.shape, dtype=torch.bool, device=token_ids.device)
        return ClassifierOutput(self.head(self.head_dropout(self.pool(x, key_padding_mask))), None)


def build_models(config: NetworkConfig, device) -> dict[str, nn.Module]:
    """One model per side: this project with each kernel (the same weights), and the peer."""
    manual = AttentionClassifier(replace(config, attention_kernel="manual"))
    fused = AttentionClassifier(replace(config, attention_kernel="fused"))
    fused.load_state_dict(manual.state_dict())
    models = {"manual": manual, "fused": fused, "peer": TransformerEncoderClassifier(config)}
    return {side: model.to(device) for side, model in models.items()}


def make_batch(lengths, vocab_size: int, num_classes: int, generator, device, pad: bool = True):
    """Token ids (B, L) padded with PAD_ID to the longest length, padding mask (B, L) or None, labels (B,)."""
    lengths = torch.as_tensor(lengths)
    L = int(lengths.max())
    token_ids = torch.randint(UNK_ID + 1, vocab_size, (len(lengths), L), generator=generator)
    mask = padding_mask(lengths, L)  # (B, L), True = padding
    token_ids = token_ids.masked_fill(mask, PAD_ID)
    labels = torch.randint(0, num_classes, (len(lengths),), generator=generator)
    return token_ids.to(device), mask.to(device) if pad else None, labels.to(device)


def sst2_lengths(rng: np.random.Generator, n: int) -> np.ndarray:
    counts = np.array(SST2_LENGTH_COUNTS)
    return rng.choice(np.arange(1, len(counts) + 1), size=n, p=counts / counts.sum())


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def alternate(runs: dict, *, warmup: int, repeats: int, device) -> dict[str, float]:
    """Median seconds per call of each run, calling them in turn (A B C A B C …) so background load hits all alike."""
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
    """Training and inference sentences/s of every side on the same batches: one row per task."""
    optimizers = {side: torch.optim.AdamW(model.parameters(), lr=1e-3) for side, model in models.items()}
    tasks = {
        "train": (train_batches, lambda side, batches: train(models[side], optimizers[side], batches)),
        "infer": (inference_batches, lambda side, batches: infer(models[side], batches)),
    }
    rows = []
    for task, (batches, run) in tasks.items():
        seconds = alternate({side: partial(run, side, batches) for side in models}, warmup=plan.warmup,
                            repeats=plan.repeats, device=device)
        # One step on the longest batch, after the timed runs so that the optimizer state already exists.
        longest = [max(batches, key=lambda batch: batch[0].numel())]
        memory = {side: peak_memory(partial(run, side, longest), device) for side in models}
        sentences = sum(len(labels) for _, _, labels in batches)
        row = dict(workload=workload, task=task, batch=len(batches[0][2]),
                   tokens=sum(ids.numel() for ids, _, _ in batches) // len(batches),
                   real=sum(int(mask.numel() - mask.sum()) if mask is not None else ids.numel()
                            for ids, mask, _ in batches) // len(batches))
        for side in models:
            row[f"{side}_per_s"], row[f"{side}_mb"] = sentences / seconds[side], memory[side] / 2**20
        for kernel in KERNELS:
            row[f"{kernel}_ratio"] = row[f"{kernel}_per_s"] / row["peer_per_s"]
            row[f"{kernel}_memory_ratio"] = memory[kernel] / max(memory["peer"], 1)
        rows.append(row)
        log.info("%s %s: manual %.2fx, fused %.2fx", workload, task, row["manual_ratio"], row["fused_ratio"])
    return rows


def compare_attention(config: NetworkConfig, L: int, plan, device, generator) -> dict:
    """The attention layer alone as the classifier calls it (forward_packed), forward + backward, on B sequences of
    L tokens, about a quarter of them padding: each kernel, the manual one handing out its weights, and the bare
    scaled_dot_product_attention between the same four projections on the padded grid."""
    B = max(1, plan.attention_tokens // L)
    torch.manual_seed(0)
    layers = {kernel: MultiHeadSelfAttention(d_model=config.d_model, n_heads=config.n_heads, d_head=config.d_head,
                                             kernel=kernel).to(device) for kernel in KERNELS}
    layers["fused"].load_state_dict(layers["manual"].state_dict())
    layer = layers["manual"]
    lengths = torch.randint(L // 2 + 1, L + 1, (B,), generator=generator)
    lengths[0] = L
    mask = padding_mask(lengths, L).to(device)  # (B, L), True = padding
    grid = torch.randn(B, L, config.d_model, device=device)
    x = grid[~mask].requires_grad_()  # (N, D): the real tokens, as the classifier hands them over
    grid.requires_grad_()

    def packed(kernel, need_weights=False):
        layers[kernel].forward_packed(x, mask, need_weights)[0].sum().backward()

    def sdpa():
        q, k, v = (layer.split_heads(w(grid)) for w in (layer.w_q, layer.w_k, layer.w_v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask[:, None, None, :], scale=layer.scale)
        layer.w_o(layer.merge_heads(out)).sum().backward()

    runs = {"manual": partial(packed, "manual"), "fused": partial(packed, "fused"),
            "weights": partial(packed, "manual", need_weights=True), "sdpa": sdpa}
    seconds = alternate(runs, warmup=plan.warmup, repeats=plan.repeats, device=device)
    memory = {name: peak_memory(run, device) for name, run in runs.items()}
    row = dict(L=L, batch=B)
    for name in runs:
        row[f"{name}_ms"], row[f"{name}_mb"] = seconds[name] * 1e3, memory[name] / 2**20
        row[f"{name}_ratio"] = seconds["sdpa"] / seconds[name]
    log.info("attention L=%d: manual %.2fx, fused %.2fx of sdpa", L, row["manual_ratio"], row["fused_ratio"])
    return row


def tables(classifier_rows, attention_rows) -> str:
    lines = []
    lines.append("\nClassifier: this project with its manual (default) and fused kernels vs the nn.TransformerEncoder peer,"
          " sentences/s;\n×peer = throughput ÷ peer's (>1: faster than the peer); MB = peak MB of one step")
    lines.append(f"{'workload':<10}{'task':<7}{'batch':>6}{'tokens':>8}{'real':>7}{'manual/s':>10}{'fused/s':>9}"
          f"{'peer/s':>9}{'manual':>8}{'fused':>7}{'man MB':>8}{'fus MB':>8}{'peer MB':>8}")
    for r in classifier_rows:
        lines.append(f"{r['workload']:<10}{r['task']:<7}{r['batch']:>6}{r['tokens']:>8}{r['real']:>7}"
              f"{r['manual_per_s']:>10.0f}{r['fused_per_s']:>9.0f}{r['peer_per_s']:>9.0f}{r['manual_ratio']:>7.2f}x{r['fused_ratio']:>6.2f}x"
              f"{r['manual_mb']:>8.1f}{r['fused_mb']:>8.1f}{r['peer_mb']:>8.1f}")
    lines.append("\nAttention layer alone (forward_packed), forward + backward, the four projections included; weights = the"
          " manual kernel\nhanding out its weights; sdpa = the bare kernel between the same projections on the padded"
          " grid;\n×sdpa = sdpa time ÷ path time (>1: faster than the bare kernel)")
    lines.append(f"{'L':>6}{'batch':>6}{'manual ms':>11}{'fused ms':>10}{'weights ms':>12}{'sdpa ms':>9}{'manual':>8}"
          f"{'fused':>7}{'weights':>9}{'man MB':>8}{'fus MB':>8}{'wts MB':>8}{'sdpa MB':>8}")
    for r in attention_rows:
        lines.append(f"{r['L']:>6}{r['batch']:>6}{r['manual_ms']:>11.2f}{r['fused_ms']:>10.2f}{r['weights_ms']:>12.2f}"
              f"{r['sdpa_ms']:>9.2f}{r['manual_ratio']:>7.2f}x{r['fused_ratio']:>6.2f}x{r['weights_ratio']:>8.2f}x"
              f"{r['manual_mb']:>8.1f}{r['fused_mb']:>8.1f}{r['weights_mb']:>8.1f}{r['sdpa_mb']:>8.1f}")
    return "\n".join(lines)


def summary(classifier_rows, attention_rows, config, device) -> dict:
    """Flat keys: {kernel}_{task}_ratio_{workload} (throughput ÷ peer's, the very numbers of {task}_per_s_{workload}),
    {kernel}_{task}_memory_ratio_{workload}, attention_{path}_vs_sdpa_L{L}; then what was measured on."""
    result = {}
    for r in classifier_rows:
        suffix = f"{r['task']}_ratio_{r['workload']}"
        for kernel in KERNELS:
            result[f"{kernel}_{suffix}"] = r[f"{kernel}_ratio"]
            result[f"{kernel}_{r['task']}_memory_ratio_{r['workload']}"] = r[f"{kernel}_memory_ratio"]
        result[f"{r['task']}_per_s_{r['workload']}"] = {side: r[f"{side}_per_s"] for side in SIDES}
    for r in attention_rows:
        for path in ("manual", "fused", "weights"):
            result[f"attention_{path}_vs_sdpa_L{r['L']}"] = r[f"{path}_ratio"]
    result.update(device=str(device), torch=torch.__version__, threads=torch.get_num_threads(),
                  network=config.to_dict())
    return result


def add_arguments(parser):
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer repeats and steps: about a minute on 2 CPU cores")
    size.add_argument("--smoke", action="store_true", help="tiny model and lengths, one repeat: a few seconds")
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto", help="auto = cuda if available")
    parser.add_argument("--config", type=Path, default=CONFIG,
                        help="take the network from its model.network section and data.vocab_size (%(default)s)")
    for key in ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size"):
        parser.add_argument("--" + key.replace("_", "-"), type=int, help=f"override the config's {key}")
    parser.add_argument("--pooling", choices=POOLINGS, help="override the config's pooling")
    parser.add_argument("--repeats", type=int, help="timed repeats per measurement (median is reported)")
    parser.add_argument("--seed", type=int, default=0)


def run(args) -> tuple[str, dict]:
    # The peer's fast path warns that nested tensors are a prototype; that is how it runs by default.
    warnings.filterwarnings("ignore", message="The PyTorch API of nested tensors is in prototype stage")
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(args.device)
    plan = PLANS["smoke" if args.smoke else "quick" if args.quick else "default"]
    if args.repeats:
        plan = replace(plan, repeats=args.repeats)
    try:
        config = SMOKE_NETWORK if args.smoke else network_config(args.config)
        overrides = {key: getattr(args, key) for key in ("d_model", "n_heads", "n_layers", "d_ff", "vocab_size",
                                                         "pooling") if getattr(args, key) is not None}
        # Positions for the longest fixed length; two classes, as SST-2 has.
        longest = max(*plan.fixed_lengths, len(SST2_LENGTH_COUNTS))
        config = replace(config, **overrides, num_classes=2, max_length=longest)
        models = build_models(config, device)
    except (ConfigError, OSError) as e:  # a bad setting, or a --config file that cannot be read
        raise SystemExit(f"error: {e}") from None
    log.info("device %s, torch %s, %d threads, network %s", device, torch.__version__, torch.get_num_threads(), config)

    torch.manual_seed(args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)

    def batches(size, steps, lengths=None):
        return [make_batch(sst2_lengths(rng, size) if lengths is None else [lengths] * size, config.vocab_size,
                           config.num_classes, generator, device, pad=lengths is None) for _ in range(steps)]

    rows = compare_classifiers(models, "sst2", batches(plan.train_batch, plan.train_steps),
                               batches(plan.inference_batch, plan.inference_steps), plan, device)
    shortest = min(plan.fixed_lengths)
    for L in plan.fixed_lengths:
        # Fewer sentences as they grow longer, so every step holds about as many tokens as at the shortest length.
        train_batch, inference_batch = (max(1, n * shortest // L) for n in (plan.train_batch, plan.inference_batch))
        rows += compare_classifiers(models, f"L{L}", batches(train_batch, plan.train_steps, L),
                                    batches(inference_batch, plan.inference_steps, L), plan, device)
    attention_rows = [compare_attention(config, L, plan, device, generator) for L in plan.attention_lengths]

    return tables(rows, attention_rows), summary(rows, attention_rows, config, device)
