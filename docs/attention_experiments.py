"""Seeing attention go wrong: train sst2.yaml as shipped, with a far too small scale, and with no scaling at all,
then print each run's attention health as a markdown table and save one heatmap per run for the same sentence.

    python docs/attention_experiments.py                                               # the full runs (slow on a CPU)
    python docs/attention_experiments.py --max-epochs 1 --limit-train-batches 300      # a quick version
    python docs/attention_experiments.py --runs default --max-epochs 1 --limit-train-batches 2 \
        --out /tmp/attention --save-dir /tmp/attention                                  # checks that it runs

The runs differ only in model.network.scale / d_head (configs/experiments/). Heatmaps go to
docs/attention_<run>.png; TensorBoard logs to runs/attention_experiments/<run>/.
The health figures are AttentionMonitor's, over the whole validation set after the last epoch.
"""

import argparse
from pathlib import Path

import torch

import train
from monitor import AttentionMonitor
from monitor.heatmap import attention_figure, save_png

ROOT = Path(__file__).resolve().parents[1]

RUNS = {
    "default": [],
    "over_uniform": ["--config", str(ROOT / "configs" / "experiments" / "over_uniform.yaml")],
    "no_scaling": ["--config", str(ROOT / "configs" / "experiments" / "no_scaling.yaml")],
}
PROBE = "the plot is thin , but the acting is wonderful and the ending is not bad at all ."


def fit(run: str, args) -> object:
    options = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
               "--trainer.logger.init_args.save_dir", str(args.save_dir),
               "--trainer.logger.init_args.name", run, "--trainer.logger.init_args.version", "0"]
    if args.max_epochs is not None:
        options += ["--trainer.max_epochs", str(args.max_epochs)]
    if args.limit_train_batches is not None:
        options += ["--trainer.limit_train_batches", str(args.limit_train_batches)]
    return train.main(["fit", "--config", str(ROOT / "configs" / "sst2.yaml"), *RUNS[run], *options])


@torch.no_grad()
def probe_figure(cli, run: str, text: str):
    tokenizer, model = cli.datamodule.tokenizer, cli.model.model.eval()
    ids = tokenizer.encode(text).ids
    logits, attention = model(torch.tensor([ids], device=cli.model.device), need_weights=True)
    probability = logits.softmax(-1)[0]
    label = cli.model.label_names[int(probability.argmax())]
    title = f'{run}: "{text}"\npredicted {label} ({probability.max():.2f})'
    weights = torch.stack([layer.weights[0] for layer in attention])  # (n_layers, H, L, L)
    return attention_figure(weights, [tokenizer.id_to_token(i) for i in ids], title)


def table_rows(run: str, accuracy: float, figures, thresholds) -> list[str]:
    rows = []
    for layer, verdicts in enumerate(figures.verdicts(thresholds)):
        def per_head(values):
            return " ".join(f"{v:.2f}" for v in values[layer].tolist())
        rows.append(
            f"| {run if layer == 0 else ''} | {f'{accuracy:.3f}' if layer == 0 else ''} | {layer} "
            f"| {per_head(figures.entropy)} | {per_head(figures.max_weight)} | {per_head(figures.score_std)} "
            f"| {', '.join(verdicts)} |"
        )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-epochs", type=int, help="default: the config's")
    parser.add_argument("--limit-train-batches", type=float, help="training batches per epoch (int) or share (float)")
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--probe", default=PROBE, help="the sentence drawn in every heatmap")
    parser.add_argument("--out", type=Path, default=ROOT / "docs")
    parser.add_argument("--save-dir", type=Path, default=ROOT / "runs" / "attention_experiments")
    args = parser.parse_args()
    if args.limit_train_batches is not None and args.limit_train_batches.is_integer():
        args.limit_train_batches = int(args.limit_train_batches)

    rows = []
    for run in args.runs:
        cli = fit(run, args)
        monitor = next(c for c in cli.trainer.callbacks if isinstance(c, AttentionMonitor))
        accuracy = float(cli.trainer.callback_metrics["val/acc"])
        rows += table_rows(run, accuracy, monitor.figures, monitor.thresholds)
        path = save_png(probe_figure(cli, run, args.probe), args.out / f"attention_{run}.png", dpi=110)
        print(f"{run}: validation accuracy {accuracy:.3f}, heatmap {path}", flush=True)
    print("\n| run | val acc | layer | entropy per head | max weight per head | score std per head | verdicts |")
    print("|:---|---:|---:|:---|:---|:---|:---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
