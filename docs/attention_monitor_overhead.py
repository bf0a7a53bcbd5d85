"""What AttentionMonitor costs: training throughput (samples/s) with and without it, on the same machine.

    python docs/attention_monitor_overhead.py                      # configs/sst2.yaml, 1 epoch of 300 batches, 3 pairs
    python docs/attention_monitor_overhead.py --pairs 5 --limit-train-batches 500
    python docs/attention_monitor_overhead.py --config configs/smoke.yaml --pairs 1 --limit-train-batches 2  # runs?

Runs alternate (without, with, without, with, ...) so a drifting machine load hits both alike; each is a fresh
process. Throughput = trained samples / seconds from the start of training to its end (training, the validation
pass with the monitor's extra forward, its heatmaps and histograms, checkpointing; not data loading or set-up).
The validation set is always read in full, so a shortened epoch overstates the monitor's share of the time.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lightning.pytorch import Callback

from monitor import AttentionMonitor

ROOT = Path(__file__).resolve().parents[1]
TIMER = {"class_path": "__main__.FitTimer"}  # the child process runs this file as __main__
MONITOR = {"class_path": "monitor.AttentionMonitor"}


class FitTimer(Callback):
    """Seconds from on_train_start to on_train_end (Lightning's own Timer does not survive the config dump)."""

    def on_train_start(self, trainer, pl_module):
        self.start = time.perf_counter()

    def on_train_end(self, trainer, pl_module):
        self.seconds = time.perf_counter() - self.start


def one_run(config: str, limit_train_batches: int, with_monitor: bool) -> float:
    """Train once in this process; return samples per second."""
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
    samples = limit_train_batches * cli.datamodule.hparams.batch_size
    return samples / timer.seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "sst2.yaml"))
    parser.add_argument("--limit-train-batches", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--one", choices=["with", "without"], help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_run(args.config, args.limit_train_batches, args.one == "with")))
        return
    data_root = os.environ.get("ATTENTION_DATA_ROOT", str(ROOT.parent / "shared" / "data"))
    env = {**os.environ, "ATTENTION_DATA_ROOT": data_root}
    rates = {"without": [], "with": []}
    for pair in range(args.pairs):
        for kind in ("without", "with"):
            result = subprocess.run(
                [sys.executable, __file__, "--one", kind, "--config", args.config,
                 "--limit-train-batches", str(args.limit_train_batches)],
                cwd=ROOT, env=env, capture_output=True, text=True, check=True,
            )
            rates[kind].append(json.loads(result.stdout.strip().splitlines()[-1]))
            print(f"pair {pair}: {kind:7s} monitor {rates[kind][-1]:7.1f} samples/s", flush=True)
    without, with_ = statistics.median(rates["without"]), statistics.median(rates["with"])
    print(f"\nmedian samples/s: without {without:.1f}, with {with_:.1f}; overhead {100 * (1 - with_ / without):.1f}%")


if __name__ == "__main__":
    main()
