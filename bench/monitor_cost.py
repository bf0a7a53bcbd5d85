"""What the attention monitor costs on a trained run: validation passes of its checkpoint with and without the
AttentionMonitor, alternating (without, with, without, with, …), each timed whole (the monitor's health reading
and its probe heatmaps included).

    python bench/monitor_cost.py lightning_logs/imdb/local/lightning_logs/version_0 --repeats 2

The run folder holds the config.yaml train.py wrote and checkpoints/; the best-validation checkpoint is used. The
last stdout line is JSON: median seconds of a validation pass without and with the monitor, the difference, and the
first pass with the monitor (which also lays out its probe heatmaps once, as the first epoch of a training run does).
"""

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import yaml
from lightning.pytorch.loggers import TensorBoardLogger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere, as bench/ensemble.py

from data import TextDataModule  # noqa: E402
from monitor import AttentionMonitor  # noqa: E402
from training.module import ClassifierModule  # noqa: E402


def monitor_of(config: dict, **overrides) -> AttentionMonitor:
    """The run's own AttentionMonitor settings (trainer.callbacks of its config.yaml, else the defaults)."""
    for callback in config["trainer"].get("callbacks") or []:
        if isinstance(callback, dict) and callback.get("class_path", "").endswith("AttentionMonitor"):
            return AttentionMonitor(**((callback.get("init_args") or {}) | overrides))
    return AttentionMonitor(**overrides)


def validation_seconds(module, datamodule, monitor: AttentionMonitor | None, folder: str) -> float:
    trainer = L.Trainer(
        logger=TensorBoardLogger(folder, name="monitor_cost"), callbacks=[monitor] if monitor else [],
        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
    )
    start = time.perf_counter()
    trainer.validate(module, datamodule=datamodule, verbose=False)
    return time.perf_counter() - start


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="a run folder of train.py (holds config.yaml and checkpoints/)")
    parser.add_argument("--repeats", type=int, default=2, help="validation passes each way (default 2)")
    parser.add_argument("--health-rows", type=int, default=-1,
                        help="the monitor's health_rows instead of the run's; 0 = every row (the cost before "
                             "sampling existed)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    config = yaml.safe_load((args.run / "config.yaml").read_text())
    (checkpoint,) = sorted(args.run.glob("checkpoints/best-*.ckpt"))[-1:]
    datamodule = TextDataModule(**config["data"])
    module = ClassifierModule.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    seconds = {"without": [], "with": []}
    # One monitor throughout, as in training: its first pass also lays out the probe heatmaps (reported apart),
    # later passes only redraw them.
    overrides = {} if args.health_rows < 0 else {"health_rows": args.health_rows or None}
    monitor = monitor_of(config, **overrides)
    with tempfile.TemporaryDirectory() as folder:
        validation_seconds(module, datamodule, None, folder)  # warm-up: data loaded, caches filled
        first = validation_seconds(module, datamodule, monitor, folder)
        for _ in range(args.repeats):
            seconds["without"].append(validation_seconds(module, datamodule, None, folder))
            seconds["with"].append(validation_seconds(module, datamodule, monitor, folder))
    summary = {name: round(statistics.median(values), 2) for name, values in seconds.items()}
    summary |= {"monitor_seconds": round(summary["with"] - summary["without"], 2), "first_with": round(first, 2),
                "health_rows": monitor.health.rows_per_batch,
                "run": str(args.run), "checkpoint": checkpoint.name, "all": seconds}
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
