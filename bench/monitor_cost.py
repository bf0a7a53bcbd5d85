"""What the attention monitor costs, measured two ways; runs alternate (without, with, without, with, …) so a
drifting machine load hits both alike.

A trained run: validation passes of its best checkpoint with and without the AttentionMonitor, each timed whole
(the monitor's health reading and its probe heatmaps included). The monitor only works on validation batches, so
this is all it adds to an epoch.

    python -m bench.monitor_cost lightning_logs/imdb/local/lightning_logs/version_0 --repeats 2

The run folder holds the config.yaml train.py wrote and checkpoints/; its best checkpoint is the one with the best
validation accuracy recorded inside it (bench.common.best_checkpoint). The last stdout line is JSON: median seconds
of a validation pass without and with the monitor, the difference, and the first pass with the monitor (which also
lays out its probe heatmaps once, as the first epoch of a training run does).

A config, trained from scratch: training throughput (samples/s) of one epoch with and without the monitor, each
run a fresh process; from the start of training to its end (training, validation with the monitor's health
figures, heatmaps and histograms, checkpointing; not data loading or set-up). The validation set is always read in
full, so a shortened epoch overstates the monitor's share of the time.

    python -m bench.monitor_cost --fit configs/sst2.yaml --pairs 2 --limit-train-batches 1053    # a full epoch
    python -m bench.monitor_cost --fit configs/smoke.yaml --pairs 1 --limit-train-batches 2      # does it run?
"""

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
from lightning.pytorch import Callback
from lightning.pytorch.loggers import TensorBoardLogger

from bench.common import ROOT, best_checkpoint, read_config
from data import TextDataModule
from monitor import AttentionMonitor
from training.module import ClassifierModule

TIMER = {"class_path": "__main__.FitTimer"}  # the child process runs this module as __main__
MONITOR = {"class_path": "monitor.AttentionMonitor"}


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


def validation_cost(run: Path, repeats: int, health_rows: int) -> dict:
    """Validation passes of a trained run's best checkpoint without and with its monitor."""
    config = read_config(run / "config.yaml")
    checkpoint = best_checkpoint(run)
    datamodule = TextDataModule(**config["data"])
    module = ClassifierModule.load_from_checkpoint(checkpoint, map_location="cpu", weights_only=True)
    seconds = {"without": [], "with": []}
    # One monitor throughout, as in training: its first pass also lays out the probe heatmaps (reported apart),
    # later passes only redraw them.
    overrides = {} if health_rows < 0 else {"health_rows": health_rows or None}
    monitor = monitor_of(config, **overrides)
    with tempfile.TemporaryDirectory() as folder:
        validation_seconds(module, datamodule, None, folder)  # warm-up: data loaded, caches filled
        first = validation_seconds(module, datamodule, monitor, folder)
        for _ in range(repeats):
            seconds["without"].append(validation_seconds(module, datamodule, None, folder))
            seconds["with"].append(validation_seconds(module, datamodule, monitor, folder))
    summary = {name: round(statistics.median(values), 2) for name, values in seconds.items()}
    return summary | {"monitor_seconds": round(summary["with"] - summary["without"], 2), "first_with": round(first, 2),
                      "health_rows": monitor.health.rows_per_batch,
                      "run": str(run), "checkpoint": checkpoint.name, "all": seconds}


class FitTimer(Callback):
    """Seconds from on_train_start to on_train_end (Lightning's own Timer does not survive the config dump)."""

    def on_train_start(self, trainer, pl_module):
        self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        self.seconds = time.perf_counter() - self.start


def one_fit(config: str, limit_train_batches: int, with_monitor: bool) -> float:
    """Train one epoch in this process; return samples per second."""
    import train  # here, not at the top: only the child processes train

    with tempfile.TemporaryDirectory() as save_dir:
        # The list replaces the config's own trainer.callbacks (sst2.yaml lists the monitor).
        callbacks = [TIMER, MONITOR] if with_monitor else [TIMER]
        cli = train.main([
            "fit", "--config", config, "--trainer.max_epochs", "1",
            "--trainer.limit_train_batches", str(limit_train_batches), "--trainer.callbacks", json.dumps(callbacks),
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
            "--trainer.logger.init_args.save_dir", save_dir,
        ])
    monitors = sum(isinstance(c, AttentionMonitor) for c in cli.trainer.callbacks)
    if monitors != int(with_monitor):
        raise SystemExit(f"error: {monitors} AttentionMonitor(s) in a run {'with' if with_monitor else 'without'} it")
    timer = next(c for c in cli.trainer.callbacks if isinstance(c, FitTimer))
    return limit_train_batches * cli.datamodule.hparams.batch_size / timer.seconds


def fit_cost(config: str, pairs: int, limit_train_batches: int) -> dict:
    """Training throughput with and without the monitor, each fit a fresh process."""
    env = {**os.environ}
    env.setdefault("ATTENTION_DATA_ROOT", str(ROOT.parent / "shared" / "data"))
    rates = {"without": [], "with": []}
    for pair in range(pairs):
        for kind in ("without", "with"):
            result = subprocess.run(
                [sys.executable, "-m", "bench.monitor_cost", "--one", kind, "--fit", config,
                 "--limit-train-batches", str(limit_train_batches)],
                cwd=ROOT, env=env, capture_output=True, text=True,
            )
            if result.returncode:
                raise SystemExit(f"error: the fit {kind} the monitor failed:\n{result.stderr.strip()[-2000:]}")
            rates[kind].append(json.loads(result.stdout.strip().splitlines()[-1]))
            logging.info("pair %d: %-7s monitor %7.1f samples/s", pair, kind, rates[kind][-1])
    without, with_ = statistics.median(rates["without"]), statistics.median(rates["with"])
    return {"without_samples_per_s": round(without, 1), "with_samples_per_s": round(with_, 1),
            "overhead_percent": round(100 * (1 - with_ / without), 1), "config": config, "all": rates}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, nargs="?", help="a run folder of train.py (holds config.yaml and checkpoints/)")
    parser.add_argument("--repeats", type=int, default=2, help="run: validation passes each way (default 2)")
    parser.add_argument("--health-rows", type=int, default=-1,
                        help="run: the monitor's health_rows instead of the run's; 0 = every row (the cost before "
                             "sampling existed)")
    parser.add_argument("--fit", metavar="CONFIG", help="train this config from scratch instead of reading a run")
    parser.add_argument("--pairs", type=int, default=3, help="--fit: fits each way (default 3)")
    parser.add_argument("--limit-train-batches", type=int, default=300, help="--fit: the epoch's length (default 300)")
    parser.add_argument("--one", choices=["with", "without"], help=argparse.SUPPRESS)  # a child process of --fit
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.fit else logging.WARNING, format="%(message)s")
    if args.one:
        print(json.dumps(one_fit(args.fit, args.limit_train_batches, args.one == "with")))
        return {}
    if (args.run is None) == (args.fit is None):
        parser.error("give either a run folder or --fit CONFIG")
    if args.fit:
        summary = fit_cost(args.fit, args.pairs, args.limit_train_batches)
    else:
        summary = validation_cost(args.run, args.repeats, args.health_rows)
    print(json.dumps(summary))
    return summary


if __name__ == "__main__":
    main()
