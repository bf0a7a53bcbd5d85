"""The healthy sweep: the attention doctor must give no warning at any validation of a healthy run. Runs `train.py
fit` as child processes over the shipped configs that train a classifier, the no-config default on three datasets,
seeds and attention kinds, and counts the warnings each run's AttentionMonitor stored at every validation.

    python -m bench.healthy --dry-run                                   # the commands, nothing run
    python -m bench.healthy --max-epochs 3 --limit-train-batches 50 --jobs 4 --out healthy.json
    python -m bench.healthy --configs none --datasets sst2 --kinds full local --seeds 0 --limit-train-batches 20

The runs: each shipped config of configs/*.yaml that trains a classifier (a config that names no dataset is an
overlay of the config its name starts with: imdb_local.yaml on imdb.yaml; default.yaml is the no-config default
itself and pretrain.yaml pretrains), and `train.py fit --data.dataset D` for each of --datasets; each with each seed.
Each run whose config does not choose its attention kind itself is run once per --kinds entry: as configured (the
no-config default: attention auto), and with each kind, with a window of --window tokens and --projection-length
projected keys (short enough for every dataset's texts); a config that chooses its kind (imdb_local.yaml) is run as
it is. Every run writes its own folder under --work; its warnings are
read from its last.ckpt, where the monitor stores its findings of every validation (the authoritative record: the
console shows warnings only from the monitor's warn_from_epoch on). A run that fails is recorded with its error's
last line and the sweep goes on. Prints one row per run and the totals; --out FILE.json writes every run's
validations and warnings. Exit status 0 when every run finished without a warning, 1 otherwise.

The children see this process's environment (ATTENTION_DATA_ROOT for offline dataset copies) with
OMP_NUM_THREADS set to --threads. This process imports only the standard library, the flag checks (bench/common.py,
the registered dataset names) and, to read checkpoints, torch and the verdict table (monitor/doctor.py). Every flag
is checked first, --dry-run too, and --work and --out are checked writable before any run.
"""

import argparse
import ast
import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.common import check_writable, positive_number, whole_number  # flag checks; nothing heavy
from data.sources import NAMES as DATASETS  # the registered datasets (data/sources.py loads no dataset library)
from inference.limits import Parser  # one-line errors; imports nothing heavy

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def registered_kinds() -> tuple[str, ...]:
    """The names of model/kinds.py's ATTENTION_KINDS, read from its source: this process imports no project code
    (nor torch), it only starts the runs."""
    tree = ast.parse((ROOT / "model" / "kinds.py").read_text(encoding="utf-8"))
    registry = next(node.value for node in tree.body if isinstance(node, ast.AnnAssign)
                    and getattr(node.target, "id", None) == "ATTENTION_KINDS")
    return tuple(key.value for key in registry.keys)


KINDS = registered_kinds()
CONFIGURED = "configured"  # --kinds: the run as its config says (the no-config default: attention auto)
NO_CONFIG_DATASETS = ("sst2", "chnsenticorp_htl", "imdb")
NOT_CLASSIFIER_CONFIGS = ("default.yaml", "pretrain.yaml")  # the no-config default itself; pretraining
MONITOR = "AttentionMonitor"


@dataclass
class Run:
    name: str  # e.g. "sst2.yaml seed 0 full", "no config sst2 seed 1"
    command: list[str]
    folder: str
    validations: list[dict] = field(default_factory=list)  # {"step", "epoch", "warnings": [lines]}
    best: dict = field(default_factory=dict)  # {"metric", "value"}
    seconds: float = 0.0
    error: str | None = None

    @property
    def warnings(self) -> int:
        return sum(len(entry["warnings"]) for entry in self.validations)


# ---- the plan ----------------------------------------------------------------------------------------------------


def shipped_configs(folder: Path = CONFIGS) -> list[list[Path]]:
    """The shipped configs that train a classifier, each as the files given to train.py (an overlay after its base).
    An overlay is a config that names no data.dataset; its base is the config its file name starts with."""
    found = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name in NOT_CLASSIFIER_CONFIGS:
            continue
        text = path.read_text(encoding="utf-8")
        if re.search(r"^\s*dataset:", text, re.M):
            found.append([path])
            continue
        base = folder / (path.stem.split("_")[0] + ".yaml")
        if base != path and base.exists():
            found.append([base, path])
    return found


def chooses_kind(files: list[Path]) -> bool:
    """Whether an overlay of these config files sets the attention kind itself (then --kinds leave it as it is)."""
    return any(re.search(r"^\s*attention:", path.read_text(encoding="utf-8"), re.M) for path in files[1:])


def plan(configs: list[list[Path]], datasets: list[str], seeds: list[int], kinds: list[str], trainer: list[str],
         work: Path, window: int, projection_length: int, extra: list[str] = ()) -> list[Run]:
    """Every run: each seed × (each config, then no config × each dataset) × each kind, seeds outermost, so that the
    first runs of a sweep cover every data set-up (each builds its data cache once; runs that need it meanwhile wait
    for it) and the later seeds find their caches built."""
    bases = [(" + ".join(p.name for p in files), [a for p in files for a in ("--config", str(p))],
              chooses_kind(files)) for files in configs]
    bases += [(f"no config {dataset}", ["--data.dataset", dataset], False) for dataset in datasets]
    runs = []
    for seed, (label, flags, own_kind) in ((seed, base) for seed in seeds for base in bases):
        chosen = [CONFIGURED] if own_kind else list(dict.fromkeys(kinds))
        for kind in chosen:
            kind_flags = [] if kind == CONFIGURED else ["--model.network.attention", kind]
            kind_flags += {"local": ["--model.network.window", str(window)],
                           "sparse": ["--model.network.window", str(window)],
                           "linformer": ["--model.network.projection_length", str(projection_length)]}.get(kind, [])
            name = f"{label} seed {seed}" + ("" if kind == CONFIGURED else f" {kind}")
            folder = work / re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
            command = [sys.executable, str(ROOT / "train.py"), "fit", *flags, *kind_flags,
                       "--seed_everything", str(seed), "--trainer.default_root_dir", str(folder),
                       "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
                       *trainer, *extra]
            runs.append(Run(name, command, str(folder)))
    return runs


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


# ---- one run and what it stored ---------------------------------------------------------------------------------


def execute(run: Run, threads: int, timeout: float | None) -> Run:
    """Runs the child; fills in its validations and best metric from its last.ckpt, or its error."""
    folder = Path(run.folder)
    folder.mkdir(parents=True, exist_ok=True)
    environment = os.environ | {"OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    with open(folder / "log.txt", "w", encoding="utf-8") as log:
        try:
            result = subprocess.run(run.command, cwd=ROOT, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                    timeout=timeout)
            code = result.returncode
        except subprocess.TimeoutExpired:
            code = None
    run.seconds = time.perf_counter() - started
    if code != 0:
        run.error = "timed out after {:.0f} s".format(run.seconds) if code is None else \
            f"exit {code}: {last_line(folder / 'log.txt')}"
    checkpoint = newest(folder, "last.ckpt")
    if checkpoint is None:
        run.error = run.error or "no last.ckpt written"
        return run
    try:
        run.validations, run.best = read_run(checkpoint)
    except Exception as e:  # a checkpoint that does not read: the run is recorded with why
        run.error = run.error or f"{checkpoint}: {type(e).__name__}: {e}"
    return run


def last_line(path: Path) -> str:
    lines = [line.strip() for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def newest(folder: Path, name: str) -> Path | None:
    found = sorted(folder.rglob(name), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def read_run(path: Path) -> tuple[list[dict], dict]:
    """The monitor's validations ({"step", "epoch", "warnings": [one line each]}) and the best monitored metric
    ({"metric", "value"}) stored in a checkpoint."""
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return validations(checkpoint), best_metric(checkpoint)


def validations(checkpoint: dict) -> list[dict]:
    """Each stored validation of the AttentionMonitor with its warnings (findings whose verdict the monitor rated a
    warning), one line each: verdict, where, detail."""
    from monitor.doctor import VERDICTS  # the severities of this version's verdicts

    for key, state in (checkpoint.get("callbacks") or {}).items():
        if MONITOR in str(key) and isinstance(state, dict) and isinstance(state.get("history"), list):
            return [{"step": entry.get("step"), "epoch": entry.get("epoch"),
                     "warnings": [warning_line(f) for f in entry.get("findings", [])
                                  if getattr(VERDICTS.get(f.get("verdict")), "severity", None) == "warning"]}
                    for entry in state["history"]]
    raise ValueError("the checkpoint holds no AttentionMonitor history (was the monitor on?)")


def warning_line(finding: dict) -> str:
    where = "model" if finding.get("layer") is None else f"layer {finding['layer']}"
    detail = f": {finding['detail']}" if finding.get("detail") else ""
    return f"{finding.get('verdict')} ({where}){detail}"


def best_metric(checkpoint: dict) -> dict:
    """The best score of the checkpoint callback that watches a metric (val/acc or val/f1)."""
    for key, state in (checkpoint.get("callbacks") or {}).items():
        if "ModelCheckpoint" in str(key) and isinstance(state, dict) and state.get("monitor"):
            score = state.get("best_model_score")
            return {"metric": state["monitor"], "value": None if score is None else float(score)}
    return {}


# ---- the report ---------------------------------------------------------------------------------------------------


def table(runs: list[Run]) -> str:
    lines = ["| run | validations | warnings | best validation | seconds | error |", "|---|---:|---:|---|---:|---|"]
    for run in runs:
        best = f"{run.best['metric']} {run.best['value']:.4f}" if run.best.get("value") is not None else "–"
        lines.append(f"| {run.name} | {len(run.validations)} | {run.warnings} | {best} | {run.seconds:.0f} | "
                     f"{run.error or ''} |")
    return "\n".join(lines)


def totals(runs: list[Run]) -> dict:
    finished = [run for run in runs if run.validations]
    return {"total_runs": len(runs), "runs_read": len(finished), "runs_failed": sum(run.error is not None for run in runs),
            "validations": sum(len(run.validations) for run in finished),
            "warnings": sum(run.warnings for run in finished),
            "runs_with_warnings": sum(run.warnings > 0 for run in finished)}


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
