"""The proof of the attention doctor: each planted bug (bench/catalogue/bugs.py) trained into short runs, and what
the doctor said about them; healthy runs, which must get no warning.

    python -m bench.diagnosis                                     # every bug × synthetic, SST-2, ChnSentiCorp
    python -m bench.diagnosis --datasets synthetic --bugs padding-ignored look-ahead
    python -m bench.diagnosis --bugs my_module:my_bug --attention local
    python -m bench.diagnosis --quick                             # tiny: a smoke test of the bench itself
    python -m bench.diagnosis --healthy-checkpoints lightning_logs/version_3 --bugs none --no-healthy
    python -m bench.diagnosis --merge synthetic.json sst2.json     # the tables of runs saved with --out X.json

A run is bench/catalogue/proof.py's fit(): `train.py fit` in this process, the bug's network settings as flags,
its edits made on the built module, its replacements in place while it trains. Every run trains 1 epoch (healthy runs
`--healthy-epochs`) on a subset of the dataset's training split (`--rows`, stratified, seed 0) written as a CSV,
and validates on the whole validation split every `--check-every` optimizer steps, so the step at which a verdict
first appears is measured. Bug runs use the dataset's shipped config (configs/smoke.yaml for synthetic);
healthy runs use it and the no-config default (configs/default.yaml). The verdicts are the AttentionMonitor's
`history` (monitor/doctor.py): one list of findings per validation, each with a verdict whose severity is a
"warning" (a bug class) or a "note".

Prints, per run, a progress line; then the runs (expected verdict, first step seen, other warnings, validation
accuracy), the confusion matrix planted bug × warning (runs in which each was given at any validation), the healthy
runs' warnings and one JSON line. `--out FILE.md` (or .json) writes the same tables (or the JSON).
"""

import argparse
import json
import logging
import sys
import warnings
from dataclasses import asdict
from pathlib import Path

import torch

from bench.common import ROOT, check_writable
from data.checkpoint import open_checkpoint
from data.files import WriteError, check_target, describe, write_text
from inference.limits import POSITIVE, Parser
from model.kinds import ATTENTION_KINDS
from bench.catalogue.bugs import GROUPS, Bug, select_bugs
from bench.catalogue.proof import SHIPPED, checkpoint_run, measure
from bench.catalogue.scores import Run, report, summary

log = logging.getLogger("bench.diagnosis")


def main(argv=None):
    parser = Parser(prog="python -m bench.diagnosis", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--datasets", nargs="+", default=list(SHIPPED), choices=list(SHIPPED))
    parser.add_argument("--bugs", nargs="+", default=["all"],
                        help="bug names (python -m bench.catalogue.bugs lists them), module:function, 'all', "
                             f"'none', or a group: {', '.join(GROUPS)}")
    parser.add_argument("--rows", type=POSITIVE.argument(), default=3000, help="training rows of each subset")
    parser.add_argument("--check-every", type=POSITIVE.argument(), default=25,
                        help="optimizer steps between validations")
    parser.add_argument("--healthy-epochs", type=POSITIVE.argument(), default=1,
                        help="epochs of the healthy runs (bug runs train 1): more judges models that have learned")
    parser.add_argument("--attention", choices=list(ATTENTION_KINDS),
                        help="attention kind of every run, with a window of 8 tokens and 16 projected keys")
    parser.add_argument("--no-healthy", action="store_true", help="no healthy (bug-free) runs")
    parser.add_argument("--healthy-checkpoints", nargs="+", default=[], metavar="RUN",
                        help="trained runs (a run folder: its best checkpoint) or checkpoints (last.ckpt holds every "
                             "validation's verdicts), e.g. full shipped runs: the verdicts their monitor recorded while "
                             "they trained, and diagnose.py's checks on them")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test of the bench: synthetic only, 600 rows, 200 validation texts")
    parser.add_argument("--threads", type=POSITIVE.argument(), default=1)
    parser.add_argument("--work", type=Path, default=ROOT / ".cache" / "diagnosis",
                        help="subsets, the data cache and each run's scratch folder")
    parser.add_argument("--out", type=Path, help="write the tables (.md) or the JSON (.json) here")
    parser.add_argument("--merge", nargs="+", type=Path, metavar="JSON",
                        help="no runs: the tables of earlier runs' --out JSON files together (e.g. one per dataset)")
    args = parser.parse_args(argv)
    if args.merge:
        commands, runs, failed = [], [], []
        for path in args.merge:
            try:
                saved = json.loads(path.read_text())
                runs += [Run(**run) for run in saved["runs"]]
                failed += list(saved.get("failed") or [])
                commands.append(f"`{saved['command']}`")
            except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
                sys.exit(f"error: --merge {path}: not a result this bench saved with --out X.json ({describe(e)})")
        print(report(runs, "; ".join(commands), failed))
        return 1 if failed else 0

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    check_writable(parser, folders={"--work": args.work})
    try:  # every target and input checked before the runs (hours on the full bench)
        if args.out:
            check_target(args.out, "bench result")
        for path in args.healthy_checkpoints:
            if not Path(path).exists():
                raise ValueError(f"--healthy-checkpoints {path}: no such checkpoint or run folder")
            open_checkpoint(path)  # CheckpointError (one line naming the file) for one that does not read
        failed = []  # {"bug", "dataset", "error"}: a user's bug that did not load or raised, a checkpoint that failed
        bugs = select_bugs(args.bugs, failed)
    except ValueError as e:  # WriteError and CheckpointError are ones
        sys.exit(f"error: {e}")
    if failed and not bugs and args.no_healthy and not args.healthy_checkpoints:
        sys.exit(f"error: {failed[0]['error']}; nothing left to run")
    for entry in failed:
        log.error("%s; the bench goes on without it", entry["error"])

    for name in ("lightning.pytorch", "lightning.fabric", "train", "data", "training"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("monitor").setLevel(logging.ERROR)  # the doctor's console warnings: the tables say them
    warnings.filterwarnings("ignore", module=r"lightning\..*")
    torch.set_num_threads(args.threads)

    if not args.no_healthy:
        bugs.append(None)
    datasets, rows, validation_rows = (["synthetic"], 600, 200) if args.quick else (args.datasets, args.rows, None)
    command = ("python -m bench.diagnosis " + " ".join(argv if argv is not None else sys.argv[1:])).strip()

    def save(runs):  # after every run, so a long bench stopped halfway keeps what it measured
        result = {**summary(runs), "failed": failed, "runs": [asdict(run) for run in runs], "command": command}
        if args.out:
            try:
                write_text(args.out, json.dumps(result, indent=1) if args.out.suffix == ".json"
                           else report(runs, f"`{command}`", failed) + "\n", "bench result")
            except WriteError as e:  # the tables still go to stdout
                log.error("%s", e)
        return result

    runs = measure(bugs, datasets, rows, args.work, args.check_every, args.attention, validation_rows=validation_rows,
                   healthy_epochs=args.healthy_epochs, done=save, failed=failed) if bugs else []
    for path in args.healthy_checkpoints:
        try:
            runs.append(checkpoint_run(path))
        except ValueError as e:  # CheckpointError, DataError: one line for it, the others go on
            log.error("--healthy-checkpoints: left out: %s", e)  # the message names the file
            failed.append({"bug": "healthy", "dataset": path, "error": str(e)})
    result = save(runs)
    print(report(runs, f"`{command}`", failed))
    print(json.dumps({key: value for key, value in result.items() if key != "runs"}))
    return 1 if failed else 0  # a bug or checkpoint left out: the tables are not the whole bench


if __name__ == "__main__":
    sys.exit(main())
