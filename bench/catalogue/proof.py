"""The proof runner: what each entry of the catalogue earns from the doctor.

    fit(run_args(...), bug)   a planted bug (bugs.py, bugs_heldout.py) trained into a `train.py fit` run in this
                              process; returns the verdicts the AttentionMonitor recorded at each validation
    measure(bugs, datasets)   every bug × dataset, and healthy runs, as scores.Run records (bench/diagnosis.py)
    judge(entry)              a user-written class (user_attention/) through the layer contract of
                              `diagnose.py --attention`; returns its FAILed checks and whether one names its mistake

bench/diagnosis.py and bench/own_attention.py run them over the whole catalogue and print the figures
docs/DOCTOR.md and docs/OWN_ATTENTION.md publish; the tests run them on a few entries.
"""

import csv
import json
import logging
import math
import random
import tempfile
import time
from pathlib import Path

import train
from data.files import describe
from data.sources import load_splits
from inference.diagnosis import diagnose_checkpoint
from monitor import AttentionMonitor
from bench.catalogue.bugs import Bug, Plant
from bench.catalogue.scores import NO_CONFIG, Run
from monitor.doctor import Finding
from monitor.layer_contract import layer_contract
from training.module import NonFiniteLossError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
SHIPPED = {"synthetic": CONFIGS / "smoke.yaml", "sst2": CONFIGS / "sst2.yaml",
           "chnsenticorp_htl": CONFIGS / "chnsenticorp_htl.yaml"}  # the config a bug run of each dataset uses
QUIET = ["--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]
USER_CLASSES = Path(__file__).resolve().parent / "user_attention"
log = logging.getLogger(__name__)


# ---- a planted bug in a training run --------------------------------------------------------------------------------


def fit(args: list[str], bug: Bug | None = None, check_every: int | None = None):
    """Trains `train.py fit` with `args` in this process, with `bug` planted; returns (checks, accuracy, error).
    check_every: validate every this many optimizer steps (at most an epoch's)."""
    plant = Plant()
    if bug is not None:
        bug.plant(plant)
    cli = train.cli([*args, *plant.flags()], run=False)
    if check_every:
        # n validations evenly spaced, the last at the epoch's end: the few batches past n · interval are left out
        # (Lightning validates every `interval` batches, not at an epoch end that falls between two).
        data = cli.datamodule
        batches = math.ceil(len(data.split("train")) / data.hparams.batch_size)
        validations = max(1, round(batches / check_every))
        cli.trainer.val_check_interval = batches // validations
        cli.trainer.limit_train_batches = validations * (batches // validations)
    plant.edit(cli.model)
    error = None
    with plant.applied():
        try:
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        except NonFiniteLossError as e:
            error = str(e)
    (monitor,) = [c for c in cli.trainer.callbacks if isinstance(c, AttentionMonitor)]
    accuracy = cli.trainer.callback_metrics.get("val/acc")
    return checks(monitor.history), math.nan if accuracy is None else float(accuracy), error


def checks(history: list[dict]) -> list[dict]:
    """The monitor's history as {"step", "warnings", "notes"} per validation (findings as objects or plain dicts)."""
    return [check(int(entry["step"]), entry["findings"]) for entry in history]


def check(step: int | str, findings) -> dict:
    """A verdict this version does not know (a run of another version) counts as a note."""
    findings = [Finding.from_dict(f) if isinstance(f, dict) else f for f in findings]
    return {"step": step, "warnings": sorted({f.verdict for f in findings if f.severity == "warning"}),
            "notes": sorted({f.verdict for f in findings if f.severity != "warning"})}


def run_args(config: Path | None, train_file: Path, val_file: Path, root: Path, cache: Path,
             network: list[str] = (), epochs: int = 1) -> list[str]:
    """train.py flags for a run of `epochs` on these files (config None: the no-config default)."""
    return [*(["--config", str(config)] if config else []), "--data.train_file", str(train_file),
            "--data.val_file", str(val_file), "--data.cache_dir", str(cache), "--trainer.default_root_dir", str(root),
            # A CSV logger: the learning rate and the scalars are kept, no probe heatmap is drawn (TensorBoard only)
            "--trainer.logger", json.dumps({"class_path": "lightning.pytorch.loggers.CSVLogger",
                                            "init_args": {"save_dir": str(root)}}),
            "--trainer.max_epochs", str(epochs), *QUIET, *network]


def network_flags(attention: str | None) -> list[str]:
    """--attention KIND: the kind, with a window and projection short enough for sentence-length texts."""
    if not attention:
        return []
    return ["--model.network.attention", attention, "--model.network.window", "8",
            "--model.network.projection_length", "16"]


def measure(bugs: list[Bug | None], datasets: list[str], rows: int, work: Path, check_every: int,
            attention: str | None = None, validation_rows: int | None = None,
            healthy_epochs: int = 1, done=lambda runs: None, failed: list | None = None) -> list[Run]:
    """Every bug (None: healthy) × dataset, plus the healthy no-config runs; sequential, one process. A bug run
    trains 1 epoch, a healthy run `healthy_epochs`. done(runs so far) is called after each run. A bug that raises
    is left out of the runs and added to `failed` ({"bug", "dataset", "error"})."""
    plan = []
    for dataset in datasets:
        for bug in bugs:
            if bug is None or attention is None or attention in bug.kinds:
                plan.append((bug, dataset, SHIPPED[dataset]))
        if None in bugs:
            plan.append((None, dataset, None))
    runs = []
    for i, (bug, dataset, config) in enumerate(plan, 1):
        train_file, val_file = subset_files(dataset, rows, work / "data" / f"{dataset}-{rows}", validation_rows)
        label = dataset if attention is None else f"{dataset}, {attention}"
        run = Run("healthy" if bug is None else bug.name, label, config.name if config else NO_CONFIG)
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(dir=work) as root:
            args = run_args(config, train_file, val_file, Path(root), work / "cache", network_flags(attention),
                            1 if bug else healthy_epochs)
            try:
                run.checks, run.accuracy, run.error = fit(args, bug, check_every)
            except Exception as e:  # a bug that raises: one line for it, and the bench goes on with the others
                if bug is None:
                    raise
                log.error("[%d/%d] %s on %s: left out: the bug raised %s", i, len(plan), run.bug, label, describe(e))
                if failed is not None:
                    failed.append({"bug": run.bug, "dataset": label, "error": f"the bug raised {describe(e)}"})
                    done(runs)
                continue
        run.seconds = time.perf_counter() - started
        expected = "" if bug is None else f"; expected {' or '.join(bug.expects) or 'any warning'}: " + (
            f"step {step}" if (step := run.first_step(bug.expects)) is not None else "not seen")
        log.info("[%d/%d] %s on %s (%s): warnings %s%s; val acc %.3f; %.0f s%s", i, len(plan), run.bug, label,
                 run.config, ", ".join(sorted(run.warnings())) or "none", expected, run.accuracy, run.seconds,
                 f"; stopped: {run.error}" if run.error else "")
        runs.append(run)
        done(runs)
    return runs


def checkpoint_run(path: str) -> Run:
    """A trained run (or checkpoint) as a healthy Run: the verdicts its monitor recorded at every validation while it
    trained, then those of diagnose.py's checks on its validation sample (step "diagnose")."""
    started = time.perf_counter()
    diagnosis = diagnose_checkpoint(path)
    data = diagnosis.data
    run = Run("healthy", data.get("train_file") or data.get("dataset") or "?", path)
    run.checks = checks(diagnosis.history) + [check("diagnose", diagnosis.findings)]
    run.seconds = time.perf_counter() - started
    log.info("%s: warnings %s; %.0f s", path, ", ".join(sorted(run.warnings())) or "none", run.seconds)
    return run


def subset(texts: list[str], labels: list[int], rows: int, seed: int) -> tuple[list[str], list[int]]:
    """`rows` texts drawn at random, each class in its share of the whole (stratified)."""
    rng = random.Random(seed)
    by_class: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        by_class.setdefault(label, []).append(i)
    chosen = []
    for members in by_class.values():
        chosen += rng.sample(members, min(len(members), round(rows * len(members) / len(labels))))
    rng.shuffle(chosen)
    return [texts[i] for i in chosen], [labels[i] for i in chosen]


def write_csv(path: Path, texts: list[str], labels: list[int], names: list[str]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows([("text", "label"), *((t, names[y]) for t, y in zip(texts, labels))])
    return path


def subset_files(dataset: str, rows: int, folder: Path, validation_rows: int | None = None) -> tuple[Path, Path]:
    """train.csv: `rows` training texts drawn stratified (seed 0); validation.csv: the validation split (its first
    `validation_rows` after a stratified draw, when given)."""
    folder.mkdir(parents=True, exist_ok=True)
    train_file, val_file = folder / "train.csv", folder / "validation.csv"
    if not (train_file.exists() and val_file.exists()):
        splits = load_splits(dataset=dataset, data_dir=None, train_file=None, val_file=None, test_file=None,
                             text_column=None, label_column=None, val_fraction=0.1, seed=0)
        names = splits.label_names
        write_csv(train_file, *subset(splits.texts["train"], splits.labels["train"], rows, seed=0), names)
        validation = splits.texts["validation"], splits.labels["validation"]
        if validation_rows is not None:
            validation = subset(*validation, validation_rows, seed=0)
        write_csv(val_file, *validation, names)
    return train_file, val_file


# ---- a user-written class through the layer contract ----------------------------------------------------------------

RIGHT = {  # a check's FAIL → the catalogue's categories (user_attention/catalogue.py) it is evidence of
    "shapes": {"shapes"},
    "softmax-rows": {"softmax-rows"},
    "padding": {"padding", "mask-convention"},
    "neighbours": {"padding"},  # "its output does not change ... with the other texts in its batch"
    "eval-steady": {"determinism"},
    "train-eval": {"determinism"},
    "permutation": {"permutation"},
    "look-ahead": {"padding", "mask-convention", "look-ahead"},
    "stability": {"softmax-rows", "stability"},
    "mask-name": {"mask-convention"},
    "formula": {"formula"},
    "scale": {"scale"},
    "gradcheck": {"gradient"},
    "gradient": {"gradient"},
    "long-input": {"stability"},  # finite and running at the run's max_length
}


def judge(entry: dict, d_model: int = 64, heads: int = 4) -> dict:
    """One class: its FAILed checks, whether they name a category of its mistake, the seconds taken."""
    spec = f"{USER_CLASSES / entry['file']}:{entry['class_name']}"
    start = time.perf_counter()
    try:
        rows = layer_contract(spec, d_model=d_model, n_heads=heads, args=entry["args"] or None)
        failed, error = [row.check for row in rows if row.verdict == "FAIL"], ""
    except ValueError as e:
        failed, error = [], str(e)
    return judged(entry, failed, error, time.perf_counter() - start)


def judged(entry: dict, failed: list[str], error: str, seconds: float) -> dict:
    right = sorted(check for check in failed if RIGHT[check] & set(entry["expected"]))
    return {"class": f"{entry['file']}:{entry['class_name']}", "correct": entry["correct"],
            "expected": list(entry["expected"]), "failed": failed, "right": right, "error": error,
            "seconds": seconds}
