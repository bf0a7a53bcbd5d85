"""Long texts: time and peak memory of one training step (forward + backward) and one inference pass, against the
sequence length L, for full attention (the hand-written lines and the fused opt-in kernel), each kind that reads whole
long texts (model/kinds.py: a length_cap above full's), and the torch.nn.TransformerEncoder peer of bench/speed.py.

Every side is the whole classifier built from one NetworkConfig, the `model: network:` section of
configs/imdb.yaml (the long kinds with the settings of their overlays configs/imdb_<kind>.yaml), with
max_length = the longest L measured. Each L gets `--batch` texts of exactly L random tokens, no padding (the worst
case: every text as long as the batch). Timing alternates the sides (A B C … A B C …) after a warm-up, the median of
the repeats; peak memory is the peak of tensor bytes alive at once during one call (bench/speed.py peak_memory:
the profiler's record of PyTorch's CPU allocations, or torch.cuda's peak), measured in calls of their own. A side
whose full L × L attention would need more than --max-gib is skipped at that L (printed as "—").

    python -m bench.timing long          # L = 128 … 4096 (8192 for the kinds that fit), about 15 minutes
    python -m bench.timing long --quick  # L = 128 … 2048, one repeat
    python -m bench.timing long --smoke  # tiny sizes: only checks that the bench runs

Prints its tables (stderr), saves a log-log plot (docs/long_attention_bench.png), and ends with one JSON line: at the largest
L every side measured, `<kind>_speedup` (full hand-written time ÷ the kind's time, training step) and
`<kind>_memory_ratio` (the kind's peak memory ÷ full hand-written's, training step; below 1 is better), the same for
inference (`<kind>_inference_speedup`, `<kind>_inference_memory_ratio`), and per side the growth exponent of time
against L (least squares slope of log time on log L over the lengths from --fit-from up).
"""

import logging
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from bench.common import CONFIGS, ROOT, network_config
from bench.speed import TransformerEncoderClassifier, alternate, peak_memory
from data.files import write_atomically
from model.classifier import AttentionClassifier
from model.config import NetworkConfig
from model.kinds import ATTENTION_KINDS, DEFAULT_KIND as FULL

log = logging.getLogger("bench.long")

# The kinds that read whole long texts (they never build L × L), each against full attention.
LONG_KINDS = tuple(name for name, kind in ATTENTION_KINDS.items()
                   if kind.length_cap > ATTENTION_KINDS[FULL].length_cap)
SIDES = (FULL, "fused", *LONG_KINDS, "peer")
PLANS = {
    "default": dict(lengths=(128, 256, 512, 1024, 2048, 4096, 8192), warmup=2, repeats=5, batch=2),
    "quick": dict(lengths=(128, 256, 512, 1024, 2048), warmup=1, repeats=1, batch=2),
    "smoke": dict(lengths=(16, 32), warmup=0, repeats=1, batch=2),
}


def network(vocab_size: int, max_length: int, smoke: bool) -> NetworkConfig:
    """configs/imdb.yaml's network with the long kinds' own settings from their overlays (dropout off: the bench
    times the arithmetic, not the random masks); each side then picks its attention kind."""
    overlays = [path for kind in LONG_KINDS if (path := CONFIGS / f"imdb_{kind}.yaml").exists()]
    tiny = dict(d_model=16, n_heads=2, d_ff=32, window=4, projection_length=8) if smoke else {}
    return network_config(CONFIGS / "imdb.yaml", *overlays, **tiny, attention=FULL, vocab_size=vocab_size,
                          max_length=max_length, dropout=0.0, embedding_dropout=0.0, attention_dropout=0.0)


def build(side: str, config: NetworkConfig) -> torch.nn.Module:
    if side == "peer":
        return TransformerEncoderClassifier(config)
    if side == "fused":
        return AttentionClassifier(replace(config, attention_kernel="fused"))
    return AttentionClassifier(replace(config, attention=side))


def quadratic_bytes(side: str, config: NetworkConfig, batch: int, L: int) -> int:
    """Bytes of one (B, H, L, L) float32 tensor for the sides that build one (a training step keeps several)."""
    return 4 * batch * config.n_heads * L * L * config.n_layers if side in (FULL, "peer") else 0


def measure(sides: dict, batch: int, L: int, plan: dict, device, generator) -> dict[str, dict]:
    """{side: {train_s, train_bytes, inference_s, inference_bytes}} at one length."""
    vocab_size = next(iter(sides.values())).token_embedding.num_embeddings
    token_ids = torch.randint(1, vocab_size, (batch, L), generator=generator).to(device)
    labels = torch.randint(0, 2, (batch,), generator=generator).to(device)

    def train_step(model):
        def run():
            model.train()
            loss = F.cross_entropy(model(token_ids).logits, labels)
            model.zero_grad(set_to_none=True)
            loss.backward()
        return run

    def inference(model):
        def run():
            model.eval()
            with torch.inference_mode():
                model(token_ids)
        return run

    train_s = alternate({s: train_step(m) for s, m in sides.items()}, warmup=plan["warmup"], repeats=plan["repeats"],
                        device=device)
    inference_s = alternate({s: inference(m) for s, m in sides.items()}, warmup=plan["warmup"],
                            repeats=plan["repeats"], device=device)
    return {
        side: {
            "train_s": train_s[side], "train_bytes": peak_memory(train_step(model), device),
            "inference_s": inference_s[side], "inference_bytes": peak_memory(inference(model), device),
        }
        for side, model in sides.items()
    }


def growth_exponent(lengths, seconds) -> float | None:
    """Slope of log(time) against log(L), least squares; None with fewer than two points."""
    if len(lengths) < 2:
        return None
    return float(np.polyfit(np.log(lengths), np.log(seconds), 1)[0])


def summarize(results: dict, fit_from: int) -> dict:
    """results {L: {side: figures}} → the JSON summary (see the module docstring)."""
    common = max(L for L, row in results.items() if FULL in row and all(kind in row for kind in LONG_KINDS))
    full = results[common][FULL]
    summary = {"largest_common_length": common}
    for kind in LONG_KINDS:
        figures = results[common][kind]
        summary[f"{kind}_speedup"] = round(full["train_s"] / figures["train_s"], 2)
        summary[f"{kind}_memory_ratio"] = round(figures["train_bytes"] / full["train_bytes"], 4)
        summary[f"{kind}_inference_speedup"] = round(full["inference_s"] / figures["inference_s"], 2)
        summary[f"{kind}_inference_memory_ratio"] = round(figures["inference_bytes"] / full["inference_bytes"], 4)
    summary["growth_exponent"] = {}
    for side in SIDES:
        lengths = [L for L in sorted(results) if L >= fit_from and side in results[L]]
        train = growth_exponent(lengths, [results[L][side]["train_s"] for L in lengths])
        inference = growth_exponent(lengths, [results[L][side]["inference_s"] for L in lengths])
        summary["growth_exponent"][side] = {
            "train": None if train is None else round(train, 2),
            "inference": None if inference is None else round(inference, 2),
            "fitted_on": lengths,
        }
    summary["results"] = {str(L): row for L, row in results.items()}
    return summary


def table(results: dict) -> str:
    lines = []
    def cell(row, side, key, scale, digits):
        return f"{row[side][key] / scale:.{digits}f}" if side in row else "—"

    for title, key, scale, unit, digits in (
        ("training step (forward + backward)", "train_s", 1e-3, "ms", 0),
        ("training step peak memory", "train_bytes", 2**20, "MiB", 1),
        ("inference pass", "inference_s", 1e-3, "ms", 0),
        ("inference peak memory", "inference_bytes", 2**20, "MiB", 1),
    ):
        lines.append(f"\n{title}, {unit}")
        lines.append("| L | " + " | ".join(SIDES) + " |")
        lines.append("|---:|" + "---:|" * len(SIDES))
        for L, row in sorted(results.items()):
            lines.append(f"| {L} | " + " | ".join(cell(row, side, key, scale, digits) for side in SIDES) + " |")
    return "\n".join(lines)


def plot(results: dict, path: Path, title: str) -> Path:
    """Log-log: training-step time, inference time and training-step memory against L, one line per side."""
    fig = Figure(figsize=(13, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    for ax, (key, label, scale) in zip(axes, (
        ("train_s", "training step (s)", 1.0), ("inference_s", "inference pass (s)", 1.0),
        ("train_bytes", "training step peak memory (MiB)", 2**20),
    )):
        for side in SIDES:
            lengths = [L for L in sorted(results) if side in results[L]]
            ax.plot(lengths, [results[L][side][key] / scale for L in lengths], marker="o", label=side)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length L (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    return write_atomically(path, lambda temporary: fig.savefig(temporary, format="png", dpi=110), "plot")


def add_arguments(parser):
    plan = parser.add_mutually_exclusive_group()
    plan.add_argument("--quick", action="store_true", help="L up to 2048, one repeat")
    plan.add_argument("--smoke", action="store_true", help="tiny model and lengths: checks that the bench runs")
    parser.add_argument("--batch", type=int, help="texts per batch (default 2)")
    parser.add_argument("--max-gib", type=float, default=1.0,
                        help="skip full attention and the peer at a length where one (B, H, L, L) tensor per layer "
                             "exceeds this many GiB (default 1: full attention stops at L = 4096 with batch 2)")
    parser.add_argument("--fit-from", type=int, default=1024, help="fit growth exponents on L >= this (default 1024)")
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "long_attention_bench.png",
                        help="where the log-log plot goes (default docs/long_attention_bench.png)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")


def run(args) -> tuple[str, dict]:
    plan = dict(PLANS["smoke" if args.smoke else "quick" if args.quick else "default"])
    batch = args.batch or plan["batch"]
    device = torch.device(args.device)
    lengths = plan["lengths"]
    config = network(vocab_size=100 if args.smoke else 30000, max_length=max(lengths), smoke=args.smoke)
    torch.manual_seed(0)
    models = {side: build(side, config).to(device) for side in SIDES}
    generator = torch.Generator().manual_seed(0)
    results = {}
    for L in lengths:
        fits = {s: m for s, m in models.items() if quadratic_bytes(s, config, batch, L) <= args.max_gib * 2**30}
        log.info("L = %d: %s", L, ", ".join(fits))
        results[L] = measure(fits, batch, L, plan, device, generator)
    fit_from = min(args.fit_from, lengths[-2]) if args.smoke else args.fit_from
    summary = summarize(results, fit_from)
    threads = torch.get_num_threads()
    summary |= {"batch": batch, "threads": threads, "device": str(device), "network": config.to_dict()}
    title = (f"configs/imdb.yaml network (d_model {config.d_model}, {config.n_heads} heads, {config.n_layers} layer), "
             f"batch {batch}, {threads} thread(s), {device}: window {config.window}, k {config.projection_length}, "
             f"g {config.global_tokens}")
    if args.plot:
        args.plot.parent.mkdir(parents=True, exist_ok=True)
        summary["plot"] = str(plot(results, args.plot, title))
    return table(results), summary
