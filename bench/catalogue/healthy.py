"""The healthy half of the proof: runs that must get no warning at any validation. `train.py fit` as child
processes over the shipped configs that train a classifier, the no-config default on three datasets, seeds and
attention kinds, and the warnings each run's AttentionMonitor stored at every validation (bench/healthy.py runs the
sweep and prints it; docs/DOCTOR.md publishes it).

The runs: each shipped config of configs/*.yaml that trains a classifier (a config that names no dataset is an
overlay of the config its name starts with: imdb_local.yaml on imdb.yaml; default.yaml is the no-config default
itself and pretrain.yaml pretrains), and `train.py fit --data.dataset D` for each dataset; each with each seed. Each
run whose config does not choose its attention kind itself is run once per kind: as configured (the no-config
default: attention auto), and with each kind, with a window and projected keys short enough for every dataset's
texts; a config that chooses its kind (imdb_local.yaml) is run as it is. A run's warnings are read from its
last.ckpt, where the monitor stores its findings of every validation (the authoritative record: the console shows
warnings only from the monitor's warn_from_epoch on). Imports nothing heavy (torch only to read a checkpoint), so
the process that starts the runs stays small.
"""

import ast
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
            # every kind gets both settings; each reads its own (a window for local and sparse, k for linformer)
            kind_flags = [] if kind == CONFIGURED else ["--model.network.attention", kind, "--model.network.window",
                                                        str(window), "--model.network.projection_length",
                                                        str(projection_length)]
            name = f"{label} seed {seed}" + ("" if kind == CONFIGURED else f" {kind}")
            folder = work / re.sub(r"[^A-Za-z0-9_.-]+", "_", name)
            command = [sys.executable, str(ROOT / "train.py"), "fit", *flags, *kind_flags,
                       "--seed_everything", str(seed), "--trainer.default_root_dir", str(folder),
                       "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
                       *trainer, *extra]
            runs.append(Run(name, command, str(folder)))
    return runs


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
