"""What pretraining does to attention: two fine-tuned classifiers of the same data, one from scratch and one from a
pretraining checkpoint, side by side on the same probe text (heatmaps of every head) and over the same validation
texts (the monitor's health figures per head: entropy, max weight, mean attention distance).

    python docs/pretraining_attention.py --scratch RUN_A/checkpoints/best-….ckpt \\
        --pretrained RUN_B/checkpoints/best-….ckpt --dataset chnsenticorp_htl --out docs/pretraining_attention.png

Prints the health figures as a markdown table; writes one PNG (heatmaps on top, per-head distance and entropy below).
"""

import argparse
from pathlib import Path

import numpy as np
import torch
from matplotlib import rc_context
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from data.datamodule import collate
from data.sources import load_splits
from inference import TextClassifier
from monitor.health import AttentionHealth
from monitor.heatmap import font_families, shorten


@torch.no_grad()
def health(classifier: TextClassifier, texts: list[str], batch_size: int = 64):
    """The monitor's figures (monitor/health.py) over `texts`, read from the layers' own weights."""
    accumulator = AttentionHealth(rows_per_batch=None)
    ids, _, _ = classifier.encode(texts)
    model = classifier.model.eval()
    for start in range(0, len(ids), batch_size):
        batch = collate([(torch.tensor(row), torch.tensor(0)) for row in ids[start : start + batch_size]])
        attention = model(batch["input_ids"], batch["padding_mask"], need_weights=True).attention
        accumulator.update(attention, batch["padding_mask"])
    return accumulator.compute()


@torch.no_grad()
def probe_weights(classifier: TextClassifier, text: str, max_tokens: int):
    prediction = classifier.predict([text], attention=True)[0]
    n = min(len(prediction.tokens), max_tokens)
    return prediction.attention[0, :, :n, :n].numpy(), prediction.tokens[:n], prediction


def draw(runs: dict, text: str, out: Path, max_tokens: int) -> None:

    n_heads = max(run["weights"].shape[0] for run in runs.values())
    labels = [shorten(t) for t in next(iter(runs.values()))["tokens"]]
    with rc_context({"font.family": font_families([text, *labels]), "font.size": 8}):
        figure = Figure(figsize=(2.3 * n_heads + 1, 2.3 * len(runs) + 2.6), layout="constrained")
        FigureCanvasAgg(figure)
        grid = figure.add_gridspec(len(runs) + 1, n_heads, height_ratios=[1] * len(runs) + [0.9])
        for row, (name, run) in enumerate(runs.items()):
            for head in range(run["weights"].shape[0]):
                ax = figure.add_subplot(grid[row, head])
                ax.imshow(run["weights"][head], vmin=0, vmax=1, cmap="viridis", interpolation="nearest")
                ax.set_title(f"{name} · head {head}\ndistance {run['figures'].distance[0, head]:.1f}, "
                             f"entropy {run['figures'].entropy[0, head]:.2f}", fontsize=7)
                ax.set_xticks([])
                ax.set_yticks(range(len(labels)) if head == 0 else [], labels if head == 0 else [], fontsize=5)
        half = max(1, n_heads // 2)
        for column, (figure_name, label) in enumerate((("distance", "mean attention distance (tokens)"),
                                                       ("entropy", "normalized entropy"))):
            ax = figure.add_subplot(grid[-1, column * half : (column + 1) * half if column == 0 else n_heads])
            width = 0.8 / len(runs)
            for k, (name, run) in enumerate(runs.items()):
                values = getattr(run["figures"], figure_name)[0].numpy()
                ax.bar(np.arange(len(values)) + k * width, values, width, label=f"{name} ({run['accuracy']})")
            ax.set_xticks(np.arange(n_heads) + width * (len(runs) - 1) / 2, [f"head {h}" for h in range(n_heads)])
            ax.set_ylabel(label)
            ax.legend(fontsize=7)
        figure.suptitle(f'Layer 0 on "{text[:24]}…": from scratch (top) and from pretraining (middle); '
                        "bars: over the validation texts", fontsize=9)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=130)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scratch", required=True, type=Path)
    parser.add_argument("--pretrained", required=True, type=Path)
    parser.add_argument("--dataset", default="chnsenticorp_htl")
    parser.add_argument("--probe", type=int, default=3, help="which validation text is drawn (%(default)s)")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--accuracy", nargs=2, default=["", ""], help="test accuracy of each, for the legend")
    parser.add_argument("--out", type=Path, default=Path("docs/pretraining_attention.png"))
    args = parser.parse_args()
    splits = load_splits(dataset=args.dataset, data_dir=None, train_file=None, val_file=None, test_file=None,
                         text_column=None, label_column=None, val_fraction=0.1, seed=0)
    texts = splits.texts["validation"]
    probe = sorted(texts, key=len)[len(texts) // 4 + args.probe]  # a short, ordinary review
    runs = {}
    print("| model | head | entropy | max weight | mean distance (tokens) |\n|---|---:|---:|---:|---:|")
    for (name, path), accuracy in zip((("scratch", args.scratch), ("pretrained", args.pretrained)), args.accuracy):
        classifier = TextClassifier.from_checkpoint(path, device="cpu")
        figures = health(classifier, texts)
        weights, tokens, _ = probe_weights(classifier, probe, args.max_tokens)
        runs[name] = {"figures": figures, "weights": weights, "tokens": tokens, "accuracy": accuracy}
        for head in range(figures.entropy.shape[1]):
            print(f"| {name} | {head} | {figures.entropy[0, head]:.3f} | {figures.max_weight[0, head]:.3f} | "
                  f"{figures.distance[0, head]:.2f} |")
    draw(runs, probe, args.out, args.max_tokens)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
