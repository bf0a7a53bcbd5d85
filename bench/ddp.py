"""One process against two: does training with DDP reach the accuracy of the same run in one process?

    python -m bench.ddp                                  # configs/smoke.yaml, seeds 0 1 2, 10 epochs, on CPU
    python -m bench.ddp --config configs/sst2.yaml --seeds 0 --trainer.limit_train_batches 200

Each seed trains twice with `train.py fit`: in one process with batches of B texts, and in two processes (DDP over
gloo on this machine's CPU, `--trainer.devices 2 --trainer.strategy ddp`) with B/2 texts a rank, so each optimizer
step averages the gradients of the same B texts and both runs take the same number of steps. The two runs see the
texts in different orders and the ranks drop different last batches, so they are not expected to match exactly:
the table prints each seed's best validation figure (read from the run's last.ckpt) for both, and the mean difference
against the spread of the one-process runs over the seeds (the noise a difference is compared with).
Exit status 0 when the mean difference is within twice that spread (or 0.01, whichever is larger).
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

from bench.healthy import newest, read_run

ROOT = Path(__file__).resolve().parents[1]
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def fit(config: str, seed: int, processes: int, batch_size: int, folder: Path, extra: list[str]) -> dict:
    """One train.py fit; its best validation figure and the seconds it took."""
    command = [sys.executable, str(ROOT / "train.py"), "fit", "--config", config, "--seed_everything", str(seed),
               "--data.batch_size", str(batch_size), "--trainer.accelerator", "cpu",
               "--trainer.devices", str(processes), "--trainer.default_root_dir", str(folder), *QUIET]
    if processes > 1:
        command += ["--trainer.strategy", "ddp"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(29500 + (os.getpid() + seed) % 1000)}
    start = time.perf_counter()
    done = subprocess.run(command + extra, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"bench.ddp: {processes}-process run of seed {seed} failed: {tail}")
    checkpoint = newest(folder, "last.ckpt")
    if checkpoint is None:
        raise SystemExit(f"bench.ddp: {folder}: the run wrote no last.ckpt (is checkpointing off in {config}?)")
    _, best = read_run(checkpoint)
    return {"metric": best.get("metric"), "value": best.get("value"), "seconds": seconds}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "configs" / "smoke.yaml"))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-size", type=int, default=64, help="texts per optimizer step (B); B/2 a rank")
    parser.add_argument("--work", type=Path, default=None, help="the runs' folders (default: a temporary folder)")
    args, extra = parser.parse_known_args(argv)
    if args.batch_size < 2 or args.batch_size % 2:
        parser.error(f"--batch-size {args.batch_size}: must be even, so that two ranks take half each")
    if not Path(args.config).is_file():
        parser.error(f"--config {args.config}: file not found")
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    rows = []
    for seed in args.seeds:
        one = fit(args.config, seed, 1, args.batch_size, work / f"seed{seed}_one", extra)
        two = fit(args.config, seed, 2, args.batch_size // 2, work / f"seed{seed}_two", extra)
        rows.append({"seed": seed, "one": one, "two": two})
        print(f"seed {seed}: {one['metric']} one process {one['value']:.4f} ({one['seconds']:.0f} s), "
              f"two processes {two['value']:.4f} ({two['seconds']:.0f} s)", flush=True)
    ones = [row["one"]["value"] for row in rows]
    difference = statistics.mean(row["two"]["value"] - row["one"]["value"] for row in rows)
    spread = statistics.stdev(ones) if len(ones) > 1 else 0.0
    within = abs(difference) <= max(2 * spread, 0.01)
    print(f"mean difference (two - one) {difference:+.4f}; spread of the one-process runs over seeds {spread:.4f}: "
          + ("within noise" if within else "beyond noise"))
    figures = {"config": args.config, "batch_size": args.batch_size, "runs": rows, "mean_difference": difference,
               "one_process_spread": spread, "within_noise": within, "load_average": os.getloadavg()[0]}
    print(json.dumps(figures))
    return figures


if __name__ == "__main__":
    sys.exit(0 if main()["within_noise"] else 1)
