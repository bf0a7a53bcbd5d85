"""Memory and set-up time against the amount of data.

    python -m bench.scale memory -- --config configs/imdb.yaml --trainer.limit_train_batches 60 --trainer.max_epochs 4
    python -m bench.scale sizes                  # 25k, 100k and 1M IMDB-length texts, no config (--big: and 10M)
    python -m bench.scale sizes --texts 25000 --kind short   # SST-2-length texts
    python -m bench.scale setup dataset=imdb tokenizer=word vocab_size=30000 max_length=512 cache_dir=/tmp/c

`setup` builds (or loads) the data of those TextDataModule settings in this process and prints its peak resident
memory and what it still holds when training would start.

`sizes` writes each set as a parquet file in a scratch folder (--work; removed afterwards unless --keep), made from
the shipped IMDB reviews (train, test, unlabeled: 99,261 texts) or SST-2 phrases: text i is original i modulo their
number, its words shuffled by a seeded generator from the second copy on, so no two texts are the same; the labels
are random. Then `train.py fit --data.train_file FILE` (the generic default, configs/default.yaml) runs TRAIN_STEPS
optimizer steps, and the table gives the set-up seconds (process start to the first optimizer step), the peak
resident memory of the process tree up to then and over the whole run, training texts/s after the first step, and
on disk the encoded-data cache and datasets' Arrow copy of the file (kept in the scratch folder: HF_DATASETS_CACHE).

`memory` runs `train.py fit ARGS` in a child process and reads the resident memory of its whole process tree (the
child and any DataLoader workers, from /proc) every SAMPLE_SECONDS; the child logs the same figure at each epoch's
start, after each validation and every LOG_EVERY training batches (MemoryLog, added with `--trainer.callbacks+=`).
It prints the run's figure over time, the peak, and the growth from the end of the first epoch's validation to the
end of the last one: what a longer run would add. Ends with one JSON line. Where a run's memory goes, batch by batch:
add `--trainer.callbacks+=bench.scale.BatchPeaks` (each training batch's own peak, from the kernel's high-water
mark, and glibc's heap in use and free at each epoch's end), e.g. the settings docs/RESULTS.md compares:

    python -m bench.scale memory -- --config configs/imdb.yaml --config configs/imdb_local.yaml \
        --trainer.max_epochs 2 --trainer.limit_val_batches 0 --trainer.num_sanity_val_steps 0 \
        --trainer.callbacks '[{class_path: training.memory.ReturnFreedMemory, init_args: {mmap_threshold: null}},
                              {class_path: bench.scale.BatchPeaks}, {class_path: monitor.AttentionMonitor}]'
"""

import argparse
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from lightning.pytorch import Callback

from bench.common import check_writable, whole_number
from inference.limits import Parser
from model.errors import check_whole_number

ROOT = Path(__file__).resolve().parents[1]
SAMPLE_SECONDS = 0.2
LOG_EVERY = 20  # training batches between two MemoryLog lines
MARK = "MEMORY"
PAGE = os.sysconf("SC_PAGE_SIZE")
log = logging.getLogger("bench.scale")


def tree_rss(pid: int) -> int:
    """Resident bytes of process `pid` and all its descendants (0 for a process gone meanwhile)."""
    children = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            total += int(Path(f"/proc/{current}/statm").read_text().split()[1]) * PAGE
        except (OSError, IndexError):
            pass
        todo += children.get(current, [])
    return total


class MemoryLog(Callback):
    """Logs the resident memory of this process's tree at the moments a run's memory could grow."""

    def __init__(self, every: int = LOG_EVERY):
        check_whole_number("MemoryLog every", every, 1)
        self.every = every

    def say(self, trainer, moment: str) -> None:
        print(f"{MARK} {moment} epoch {trainer.current_epoch} step {trainer.global_step} "
              f"rss {tree_rss(os.getpid()) / 2**20:.0f} time {time.time():.2f}", file=sys.stderr, flush=True)

    def on_train_epoch_start(self, trainer, pl_module):
        self.say(trainer, "train_start")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if batch_idx % self.every == 0:
            self.say(trainer, "train")

    def on_validation_end(self, trainer, pl_module):
        if not trainer.sanity_checking:
            self.say(trainer, "validation_end")

    def on_train_end(self, trainer, pl_module):
        self.say(trainer, "train_end")


class BatchPeaks(Callback):
    """Each training batch's peak resident memory (the kernel's high-water mark, reset before the batch: Linux
    /proc/self/clear_refs) and what was resident when it began; at each epoch's end the TOP_BATCHES highest, with
    each batch's texts × padded length, and glibc's heap: bytes in use and free (mallinfo2). List it before the
    callbacks whose memory it should not count (ReturnFreedMemory's trim comes first when listed first)."""

    TOP_BATCHES = 5

    def __init__(self):
        self.rows = []

    @staticmethod
    def status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) // 1024  # kB → MiB
        return 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        try:
            Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again from what is resident
        except OSError:
            pass
        self.start = self.status("VmRSS")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.rows.append((self.status("VmHWM"), self.start, batch_idx, tuple(batch["input_ids"].shape)))

    def on_train_epoch_end(self, trainer, pl_module):
        top = ", ".join(f"batch {i} {shape[0]}x{shape[1]}: {peak} MiB (from {start})"
                        for peak, start, i, shape in sorted(self.rows, reverse=True)[: self.TOP_BATCHES])
        print(f"{MARK}_BATCHES epoch {trainer.current_epoch}: {top}; heap {heap()}", file=sys.stderr, flush=True)
        self.rows = []


def heap() -> str:
    """glibc's heap: MiB in use and free (free pages may be resident or handed back); '-' elsewhere."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in
                    "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return "-"
    mallinfo2.restype = Info
    info = mallinfo2()
    return f"in use {info.uordblks >> 20} MiB, free {info.fordblks >> 20} MiB, mapped {info.hblkhd >> 20} MiB"


def run_and_watch(command: list[str], env=None) -> dict:
    """Run `command`, sampling its process tree's resident memory; its stderr lines go to ours. Returns the peak,
    the seconds, the exit status, the MemoryLog lines as (moment, epoch, step, MiB, seconds), and the peak before the
    first MemoryLog line (set-up) and from it on (training), each with its second."""
    start, started = time.perf_counter(), time.time()
    child = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    peak, marks, first_step_peak = 0, [], None
    phases = {"setup": (0, 0.0), "training": (0, 0.0)}  # phase: (peak bytes, seconds from the start)

    def sample():
        nonlocal peak
        while child.poll() is None:
            rss, phase = tree_rss(child.pid), "training" if marks else "setup"
            peak = max(peak, rss)
            if rss > phases[phase][0]:
                phases[phase] = (rss, time.perf_counter() - start)
            time.sleep(SAMPLE_SECONDS)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for line in child.stderr:
        sys.stderr.write(line)
        if line.startswith(MARK):
            found = re.match(rf"{MARK} (\w+) epoch (\d+) step (\d+) rss (\d+) time ([\d.]+)", line)
            if found:
                marks.append((found[1], int(found[2]), int(found[3]), int(found[4]), float(found[5]) - started))
                if first_step_peak is None and marks[-1][2] >= 1:
                    first_step_peak = max(peak, marks[-1][3] * 2**20)
    child.wait()
    sampler.join()
    return {"seconds": time.perf_counter() - start, "peak_rss_mib": peak / 2**20, "returncode": child.returncode,
            "marks": marks, "first_step_peak_mib": (first_step_peak or peak) / 2**20,
            "phase_peaks": {phase: (rss / 2**20, seconds) for phase, (rss, seconds) in phases.items()}}


def memory(args) -> dict:
    command = [sys.executable, "train.py", "fit", *args.fit_args, "--trainer.callbacks+=bench.scale.MemoryLog",
               "--trainer.enable_progress_bar", "false", "--trainer.default_root_dir", args.root]
    result = run_and_watch(command)
    validations = [mib for moment, _, _, mib, _ in result["marks"] if moment == "validation_end"]
    rows = [f"{seconds:>7.0f} s {moment:>15} epoch {epoch} step {step:>6}: {mib:>6} MiB"
            for moment, epoch, step, mib, seconds in result["marks"]]
    print("\n".join(rows), file=sys.stderr)
    growth = validations[-1] - validations[0] if len(validations) > 1 else None
    print(f"peak {result['peak_rss_mib']:.0f} MiB (process tree); after the first validation "
          f"{validations[0] if validations else '-'} MiB, after the last {validations[-1] if validations else '-'} "
          f"MiB; {result['seconds']:.0f} s, load {os.getloadavg()[0]:.1f}", file=sys.stderr)
    print("; ".join(f"{phase} peak {mib:.0f} MiB at {seconds:.0f} s" for phase, (mib, seconds)
                    in result["phase_peaks"].items()), file=sys.stderr)
    return {"target": "memory", "peak_rss_mib": round(result["peak_rss_mib"]), "validation_rss_mib": validations,
            "growth_mib": growth, "setup_peak_mib": round(result["phase_peaks"]["setup"][0]),
            "training_peak_mib": round(result["phase_peaks"]["training"][0]), "seconds": round(result["seconds"]),
            "returncode": result["returncode"],
            "load_average_1min": round(os.getloadavg()[0], 2), "fit_args": args.fit_args}


SOURCES = {"long": [("imdb", name) for name in ("train.parquet", "test.parquet", "unsup.parquet")],
           "short": [("sst2", "train.tsv")]}
WRITE_CHUNK = 50_000  # texts written at a time: the sets are made in bounded memory too
TRAIN_STEPS = 60  # optimizer steps of each run: the first, then enough for a steady texts/s


def originals(kind: str) -> list[str]:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from data.sources import DATA_ROOT_ENV

    root = Path(os.environ.get(DATA_ROOT_ENV, ROOT.parent / "shared" / "data"))
    texts = []
    for dataset, name in SOURCES[kind]:
        path = root / dataset / name
        if path.suffix == ".parquet":
            texts += pq.read_table(path, columns=["text"]).column("text").to_pylist()
        else:
            options = pacsv.ParseOptions(delimiter="\t", quote_char=False)
            texts += pacsv.read_csv(path, parse_options=options).column("sentence").to_pylist()
    return texts


def write_texts(path: Path, n: int, kind: str, seed: int = 0) -> None:
    """n texts made from the shipped ones (see the module docstring), with random labels 0/1, as parquet."""
    import random

    import pyarrow as pa
    import pyarrow.parquet as pq

    base, rng = originals(kind), random.Random(seed)
    with pq.ParquetWriter(path, pa.schema([("text", pa.string()), ("label", pa.int64())])) as writer:
        for at in range(0, n, WRITE_CHUNK):
            texts = []
            for i in range(at, min(n, at + WRITE_CHUNK)):
                text = base[i % len(base)]
                if i >= len(base):
                    words = text.split()
                    rng.shuffle(words)
                    text = " ".join(words)
                texts.append(text)
            labels = [rng.randrange(2) for _ in texts]
            writer.write_table(pa.table({"text": texts, "label": labels}))


def folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def sizes(args) -> dict:
    import shutil
    import tempfile

    counts = args.texts or ([25_000, 100_000, 1_000_000] + ([10_000_000] if args.big else []))
    work = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=args.work))
    rows = []
    try:
        for n in counts:
            data = work / f"{args.kind}-{n}.parquet"
            made = time.perf_counter()
            write_texts(data, n, args.kind)
            log.info("%s: %d texts written in %.0f s (%.0f MiB)", data, n, time.perf_counter() - made,
                     data.stat().st_size / 2**20)
            command = [sys.executable, "train.py", "fit", "--data.train_file", str(data),
                       "--data.cache_dir", str(work / f"cache-{n}"), "--trainer.max_steps", str(TRAIN_STEPS),
                       "--trainer.limit_val_batches", "0", "--trainer.default_root_dir", str(work / f"run-{n}"),
                       "--trainer.enable_progress_bar", "false", "--data.batch_size", str(args.batch_size),
                       "--trainer.callbacks+=" + json.dumps({"class_path": "bench.scale.MemoryLog",
                                                              "init_args": {"every": 10}}),
                       *args.fit_args]
            # datasets' Arrow copy of the file in the scratch folder too: removed with it, and its size measured.
            result = run_and_watch(command, env={**os.environ, "HF_DATASETS_CACHE": str(work / f"arrow-{n}")})
            steps = [(step, seconds) for moment, _, step, _, seconds in result["marks"] if moment == "train"]
            first, last = steps[0] if steps else (0, 0), steps[-1] if steps else (0, 0)
            rate = round((last[0] - first[0]) * args.batch_size / (last[1] - first[1])) if last[0] > first[0] else None
            rows.append({"texts": n, "kind": args.kind, "setup_seconds": round(first[1]),
                         "peak_rss_first_step_mib": round(result["first_step_peak_mib"]),
                         "peak_rss_mib": round(result["peak_rss_mib"]), "train_texts_per_second": rate,
                         "cache_mib": round(folder_size(work / f"cache-{n}") / 2**20),
                         "arrow_mib": round(folder_size(work / f"arrow-{n}") / 2**20),
                         "returncode": result["returncode"], "load_average_1min": round(os.getloadavg()[0], 2)})
            log.info("%s", rows[-1])
            if result["returncode"]:
                break
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    header = ("| texts | set-up s | peak RSS to 1st step, MiB | peak RSS, MiB | train texts/s | cache MiB "
              "| Arrow copy MiB | load |")
    table = [header, "|---:|---:|---:|---:|---:|---:|---:|---:|"] + [
        f"| {r['texts']:,} | {r['setup_seconds']} | {r['peak_rss_first_step_mib']} | {r['peak_rss_mib']} | "
        f"{r['train_texts_per_second']} | {r['cache_mib']} | {r['arrow_mib']} | {r['load_average_1min']} |"
        for r in rows]
    print("\n".join(table), file=sys.stderr)
    return {"target": "sizes", "rows": rows, "returncode": max((r["returncode"] for r in rows), default=0)}


def plain_types(annotation) -> tuple[type, ...]:
    """The plain types a TextDataModule parameter's annotation allows (int, float, str, bool, None), or () when it
    allows anything else too (a list, a dict): then the data module checks the value itself."""
    import types
    import typing

    parts = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or \
        typing.get_origin(annotation) is typing.Union else (annotation,)
    found = tuple(type(None) if part is None else part for part in parts)
    if not all(part in (int, float, str, bool, type(None)) for part in found):
        return ()
    return found + ((int,) if float in found and int not in found else ())


def setup(args) -> dict:
    import resource

    import yaml

    from data.datamodule import TextDataModule

    import inspect

    known = inspect.signature(TextDataModule).parameters
    settings = {}
    for pair in args.settings:
        name, equals, value = pair.partition("=")
        if not equals or name not in known:
            sys.exit(f"error: setup {pair!r}: give a TextDataModule setting as name=value, name one of "
                     f"{', '.join(sorted(known))}")
        settings[name] = yaml.safe_load(value)
        wanted = plain_types(known[name].annotation)
        if wanted and not (isinstance(settings[name], wanted) and not (
                isinstance(settings[name], bool) and bool not in wanted)):
            takes = " or ".join("null" if t is type(None) else t.__name__ for t in wanted)
            sys.exit(f"error: setup {pair!r}: {name} takes {takes}, got {type(settings[name]).__name__} "
                     f"{settings[name]!r}")
    start = time.perf_counter()
    try:
        TextDataModule(**settings).state  # noqa: B018  (read, tokenize, encode, cache)
    except ValueError as e:  # DataError, ConfigError, WriteError: a bad value, a missing file, ... in one line
        sys.exit(f"error: setup: {e}")
    figures = {"target": "setup", "settings": settings, "seconds": round(time.perf_counter() - start),
               "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
               "held_rss_mib": round(tree_rss(os.getpid()) / 2**20), "load_average_1min": round(os.getloadavg()[0], 2)}
    print(f"set-up {figures['seconds']} s, peak {figures['peak_rss_mib']} MiB, held after {figures['held_rss_mib']} "
          f"MiB", file=sys.stderr)
    return figures


def main(argv=None) -> dict:
    parser = Parser(prog="python -m bench.scale", description=__doc__,
                    formatter_class=argparse.RawDescriptionHelpFormatter)  # one-line errors
    commands = parser.add_subparsers(dest="target", required=True)  # Parser too
    command = commands.add_parser("memory", help="resident memory over one `train.py fit` run")
    command.add_argument("--root", default="runs/bench-scale", help="the run's --trainer.default_root_dir")
    command.add_argument("fit_args", nargs=argparse.REMAINDER, help="train.py fit arguments, after --")
    command = commands.add_parser("sizes", help="set-up time and memory at 25k, 100k, 1M (10M) texts")
    command.add_argument("--texts", type=whole_number(1), nargs="+",
                         help="the set sizes, each >= 1 (default 25000 100000 1000000)")
    command.add_argument("--big", action="store_true", help="also 10,000,000 texts")
    command.add_argument("--kind", choices=sorted(SOURCES), default="long",
                         help="long: IMDB-length texts (1.3 KB); short: SST-2-length phrases")
    command.add_argument("--batch-size", type=whole_number(1), default=64,
                         help="data.batch_size of the runs, >= 1 (default: 64, the no-config default's)")
    command.add_argument("--work", default=None, help="scratch folder for the sets and caches (default: the temp dir)")
    command.add_argument("--keep", action="store_true", help="keep the scratch folder")
    command.add_argument("fit_args", nargs=argparse.REMAINDER, help="more train.py fit arguments, after --")
    command = commands.add_parser("setup", help="peak and held memory of one TextDataModule's set-up")
    command.add_argument("settings", nargs="+", help="TextDataModule settings as name=value")
    args = parser.parse_args(argv)
    if args.target == "sizes":  # before any set is written
        check_writable(commands.choices["sizes"], folders={"--work": args.work})
    args.fit_args = [a for a in getattr(args, "fit_args", []) if a != "--"]
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    figures = {"memory": memory, "sizes": sizes, "setup": setup}[args.target](args)
    print(json.dumps(figures))
    sys.exit(figures.get("returncode", 0))


if __name__ == "__main__":
    main()
