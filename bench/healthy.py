"""The healthy sweep: the attention doctor must give no warning at any validation of a healthy run. Runs `train.py
fit` as child processes over the shipped configs that train a classifier, the no-config default on three datasets,
seeds and attention kinds, and counts the warnings each run's AttentionMonitor stored at every validation.

    python -m bench.healthy --dry-run                                   # the commands, nothing run
    python -m bench.healthy --max-epochs 3 --limit-train-batches 50 --jobs 4 --out healthy.json
    python -m bench.healthy --configs none --datasets sst2 --kinds full local --seeds 0 --limit-train-batches 20

The runs and how their warnings are read: bench/catalogue/healthy.py. Every run writes its own folder under
--work; a run that fails is recorded with its error's last line and the sweep goes on. Prints one row per run and the
totals; --out FILE.json writes every run's validations and warnings. Exit status 0 when every run finished without a
warning, 1 otherwise.

The children see this process's environment (ATTENTION_DATA_ROOT for offline dataset copies) with
OMP_NUM_THREADS set to --threads. This process imports only the standard library, the flag checks (bench/common.py,
the registered dataset names), the runner and, to read checkpoints, torch and the verdict table. Every flag
is checked first, --dry-run too, and --work and --out are checked writable before any run.
"""

import argparse
import json
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from bench.common import check_writable, positive_number, whole_number  # flag checks; nothing heavy
from data.sources import NAMES as DATASETS  # the registered datasets (data/sources.py loads no dataset library)
from inference.limits import Parser  # one-line errors; imports nothing heavy
from bench.catalogue.healthy import (CONFIGURED, KINDS, NO_CONFIG_DATASETS, ROOT, Run, execute, plan,
                                       shipped_configs, table, totals)


def trainer_flags(args) -> list[str]:
    """The trainer limits given on the command line as train.py flags."""
    flags = []
    for option, flag in (("max_epochs", "--trainer.max_epochs"), ("limit_train_batches", "--trainer.limit_train_batches"),
                         ("limit_val_batches", "--trainer.limit_val_batches"), ("accelerator", "--trainer.accelerator"),
                         ("devices", "--trainer.devices"), ("precision", "--trainer.precision")):
        value = getattr(args, option)
        if value is not None:
            flags += [flag, str(value)]
    return flags


def main(argv=None):
    parser = Parser(prog="python -m bench.healthy", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--configs", nargs="+", default=["all"],
                        help="config files of configs/ by name (sst2.yaml, imdb_local.yaml: with its base), 'all' "
                             "(every shipped classifier config) or 'none'")
    parser.add_argument("--datasets", nargs="*", default=list(NO_CONFIG_DATASETS), choices=[*DATASETS, "none"],
                        metavar="DATASET",
                        help="datasets of the no-config runs (train.py fit --data.dataset D), of "
                             f"{', '.join(DATASETS)}; 'none' or nothing: no such runs")
    parser.add_argument("--seeds", nargs="+", type=whole_number(0), default=[0, 1, 2], help="seeds (>= 0)")
    parser.add_argument("--kinds", nargs="+", default=[CONFIGURED, *KINDS], choices=[CONFIGURED, *KINDS],
                        help=f"attention kinds each run is repeated with; '{CONFIGURED}': as its config says "
                             "(default: all of them)")
    parser.add_argument("--window", type=whole_number(1), default=8, help="window of the local and sparse kinds (--kinds)")
    parser.add_argument("--projection-length", type=whole_number(1), default=16, help="linformer's k (--kinds)")
    parser.add_argument("--max-epochs", type=whole_number(1))
    parser.add_argument("--limit-train-batches", type=batches)
    parser.add_argument("--limit-val-batches", type=batches)
    parser.add_argument("--accelerator")
    parser.add_argument("--devices")
    parser.add_argument("--precision")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[],
                        help="more train.py flags for every run (last on the line)")
    parser.add_argument("--jobs", type=whole_number(1), default=1, help="runs at a time")
    parser.add_argument("--threads", type=whole_number(1), default=None,
                        help="OMP_NUM_THREADS of each run (default: the CPU cores / --jobs)")
    parser.add_argument("--timeout", type=positive_number, default=None,
                        help="seconds a run may take, > 0 (default: no limit)")
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "healthy", help="the runs' folders")
    parser.add_argument("--out", type=Path, help="write every run's validations and warnings here (JSON)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)

    try:
        configs = select_configs(args.configs)
    except ValueError as e:
        parser.error(str(e))
    if not args.dry_run:  # before any run: results measured for hours must not be lost when they are written
        check_writable(parser, folders={"--work": args.work}, files={"--out": args.out})
    elif args.out is not None:
        check_writable(parser, files={"--out": args.out})
    datasets = [] if args.datasets == ["none"] else args.datasets
    runs = plan(configs, datasets, args.seeds, args.kinds, trainer_flags(args), args.work.resolve(),
                args.window, args.projection_length, args.extra)
    if args.dry_run:
        for run in runs:
            print(" ".join(run.command))
        print(f"{len(runs)} runs")
        return 0
    threads = args.threads or max(1, (os.cpu_count() or 1) // args.jobs)
    done, lock = [], threading.Lock()

    def one(run: Run) -> Run:
        execute(run, threads, args.timeout)
        with lock:
            report_run(run, done, runs, args)
        return run

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, runs))
    print(table(runs))
    figures = totals(runs)
    print(json.dumps(figures))
    save(args.out, runs, args)
    return 0 if figures["warnings"] == 0 and figures["runs_failed"] == 0 else 1


def report_run(run: Run, done: list[Run], runs: list[Run], args) -> None:
    """One run's progress line and its warnings; the JSON so far."""
    done.append(run)
    print(f"[{len(done)}/{len(runs)}] {run.name}: {len(run.validations)} validations, {run.warnings} warnings, "
          f"{run.seconds:.0f} s" + (f"; {run.error}" if run.error else ""), flush=True)
    for entry in run.validations:
        for line in entry["warnings"]:
            print(f"    epoch {entry['epoch']} step {entry['step']}: {line}", flush=True)
    save(args.out, runs, args)


def save(out: Path | None, runs: list[Run], args) -> None:
    """The runs so far (a sweep stopped halfway keeps what it measured)."""
    if out is None:
        return
    result = {**totals(runs), "command": "python -m bench.healthy " + " ".join(sys.argv[1:]),
              "runs": [asdict(run) | {"warnings": run.warnings} for run in runs]}
    out.write_text(json.dumps(result, indent=1), encoding="utf-8")


def select_configs(names: list[str]) -> list[list[Path]]:
    shipped = shipped_configs()
    if names == ["all"]:
        return shipped
    if names == ["none"]:
        return []
    chosen = []
    for name in names:
        matched = [files for files in shipped if files[-1].name in (name, f"{name}.yaml")]
        if not matched:
            raise ValueError(f"--configs {name}: not a shipped classifier config (known: "
                             f"{', '.join(files[-1].name for files in shipped)})")
        chosen += matched
    return chosen


def batches(text: str) -> str:
    """A Lightning batch limit: a whole number of batches (≥ 1) or a share in (0, 1]."""
    value = float(text)
    if not (value > 0 and (value <= 1 or value.is_integer())):
        raise argparse.ArgumentTypeError(f"must be a share in (0, 1] or a whole number of batches, got {text}")
    return text


if __name__ == "__main__":
    sys.exit(main())
