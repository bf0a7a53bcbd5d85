"""How a command tunes its own process: how many threads torch computes with, how they wait, and how freed memory
is kept. Each command's main() calls `configure()` before it loads torch (train.py, predict.py, serve.py, export.py,
diagnose.py, prune.py, the benches through bench/__init__.py, the tests' conftest.py); nothing in the packages does:
importing `model`, `data`, `training`, `monitor` or `inference` leaves threads, environment and allocator as the
caller set them (tests/test_runtime.py).

torch runs its operations on an OpenMP thread pool (libgomp). Its defaults hurt on a shared machine, and a laptop
always runs something else (a browser, an editor, the test suite):
- its size is every core the machine has, not the cores this process may use (a CPU affinity mask, a container's
  CPU quota), so threads queue for cores they will never get;
- between two operations its threads spin (about 300,000 pause instructions, several milliseconds) before they
  sleep. A spinning thread holds its core while the thread it waits for waits for a core: with one busy program
  beside a 2-core run, training took 4.5× as long, with two 26× (not the 2× that losing a core costs).
Sleeping at once (OMP_WAIT_POLICY=PASSIVE) fixes that but costs a wake-up at each of the hundreds of operations of a
step: quiet, 2 passive threads trained no faster than 1. So a command
- starts with the cores it may run on (`available_cores`);
- spins briefly before it sleeps (GOMP_SPINCOUNT=SPIN_COUNT, tens of µs: the gap between two operations);
- and lets its long loops resize the pool (model/threads.py `adapt()`: every training batch, each batch of predict.py
  and diagnose.py, each request of serve.py) to the cores other programs left free. A different thread count can
  split (and so round) sums differently: to repeat a seeded run bit for bit whatever else runs, set
  OMP_NUM_THREADS, which is never adapted.
400 steps of sst2.yaml, seconds quiet / beside 1 / beside 2 busy programs: passive 17.3 / 17.7 / 29.7, this
14.9-15.2 / 17.0 / 26.7-27.2 (docs/RESULTS.md "Speed").

OpenMP reads its variables once, when torch's library loads, and only from the environment: so `configure()` must
run before torch is imported, and the faces import torch inside main(), after it. The setting goes into os.environ,
so the processes a run starts (DataLoader workers, which torch then sets to one thread each; a bench's training
runs; serve's workers) inherit it; CHOSEN marks the thread count as this module's, so that a child command chooses
(and adapts) again. The user's own OMP_NUM_THREADS, OMP_WAIT_POLICY and GOMP_SPINCOUNT are kept as they are, and a
thread count the user set is never adapted. train.py logs the one line that says what was chosen and why.

Freed memory (glibc's malloc, on Linux). torch asks the C library for each tensor's memory and gives it back when
the tensor dies. glibc serves any block over its mmap threshold (128 KB at first, raised as such blocks are freed)
with fresh pages from the kernel and returns them at once when freed; free memory at the top of its heap beyond a
trim threshold goes back too. A step makes and frees the same large tensors again and again; until the threshold has
risen (in a training run the data load raises it), every step faults its pages in anew (the kernel zeroes each 4 KB
page): in a fresh process, a third of a plain-PyTorch SST-2 step (27 → 18 ms) and, at SST-2 lengths, a quarter of
`bench.timing speed`'s throughput (docs/RESULTS.md "Speed"). `keep_freed_memory` raises both thresholds (MMAP_THRESHOLD,
TRIM_THRESHOLD) through mallopt, so freed blocks are reused from the heap; the process keeps up to TRIM_THRESHOLD
of free memory for its next step. The user's own MALLOC_*_ variables (glibc's tunables) are kept, and so is a
C library that is not glibc.

This module imports nothing heavy (model/threads.py is the standard library only), so importing it loads no torch.
"""

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from model import threads

SPIN_COUNT = 2000  # GOMP_SPINCOUNT when the environment names no wait: sst2.yaml steps quiet (roofline), 300: 27.1 ms
# and 700: 27.9, as slow as a passive wait (27.7), 2,000: 21.9; beside busy programs adapt() takes the pool to 1 thread
CHOSEN = "ATTENTION_THREADS"  # the OMP_NUM_THREADS this module wrote: not the user's, so a child chooses again
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" in µs, or "max <period>"
# glibc's allocator (keep_freed_memory): blocks up to MMAP_THRESHOLD come from the heap and are reused when freed;
# free memory at the heap's top is given back beyond TRIM_THRESHOLD. A plain-PyTorch SST-2 step in a fresh process
# (a scratch script), ms: unchanged 27, 32 MB / 256 MB 18, 8 MB / 128 MB 19, 32 MB / 64 MB 20, 256 MB / 1 GB 23; a
# raised trim threshold alone 41 (it fixes glibc's moving mmap threshold at 128 KB).
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 256 << 20
MALLOC_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                    "GLIBC_TUNABLES")


@dataclass(frozen=True)
class ThreadSetting:
    threads: int
    wait_policy: str  # "PASSIVE", "ACTIVE", or "spin N" (GOMP_SPINCOUNT N, then sleep)
    source: str  # where the thread count came from, in words
    torch_first: bool = False  # torch was loaded before configure(): its wait policy could no longer change
    memory: str = ""  # what keep_freed_memory did, in words
    adapts: bool = False  # adapt() resizes the pool to the cores other programs leave free

    def describe(self) -> str:
        wait = self.wait_policy if self.wait_policy.startswith("spin") else f"OMP_WAIT_POLICY {self.wait_policy}"
        if self.torch_first:
            wait += " (not in force: torch was loaded before runtime.configure(), so its pool waits as it did)"
        adapting = "; fewer while other programs use the cores (looked at each second)" if self.adapts else ""
        return (f"torch threads: {self.threads} ({self.source}){adapting}; {wait}"
                + (f"; {self.memory}" if self.memory else ""))


def cgroup_cores(cpu_max: Path = CGROUP_CPU_MAX) -> int | None:
    """Cores a container's CPU quota allows (rounded up), or None when there is no quota or no cgroup v2 file."""
    try:
        quota, period = cpu_max.read_text().split()[:2]
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):  # no file, "max" (no quota), or a layout this does not know
        return None


def available_cores(cpu_max: Path = CGROUP_CPU_MAX) -> tuple[int, str]:
    """(cores this process may run on, why): its CPU affinity mask, capped by a container's CPU quota."""
    if hasattr(os, "sched_getaffinity"):
        cores, why = len(os.sched_getaffinity(0)), "the cores this process may run on"
    else:  # macOS, Windows: no affinity mask to read
        cores, why = os.cpu_count() or 1, "the machine's cores"
    quota = cgroup_cores(cpu_max)
    if quota is not None and quota < cores:
        cores, why = quota, f"the container's CPU quota ({cpu_max})"
    return cores, why


def requested_threads(value: str | None) -> int | None:
    """The thread count an OMP_NUM_THREADS value asks for (OpenMP's list form "4,2": its first level), or None
    when it asks for none that torch can use."""
    try:
        threads = int((value or "").split(",")[0])
    except ValueError:
        return None
    return threads if threads >= 1 else None


def choose(environ=os.environ, cpu_max: Path = CGROUP_CPU_MAX, proc_stat: Path = threads.PROC_STAT) -> ThreadSetting:
    """The setting this environment asks for: the user's OMP_NUM_THREADS, OMP_WAIT_POLICY and GOMP_SPINCOUNT when
    set, else the available cores (adapted, where the machine's load can be read) and a short spin. Writes the chosen
    values into `environ`."""
    given = environ.get("OMP_NUM_THREADS")
    if given is not None and given == environ.get(CHOSEN):  # a parent command's choice, not the user's
        given = None
    count = requested_threads(given)
    if count is not None:
        source = "OMP_NUM_THREADS"
    else:
        count, source = available_cores(cpu_max)
        if given is not None:
            source += f"; OMP_NUM_THREADS {given!r} is not a thread count, so it was replaced"
        environ["OMP_NUM_THREADS"] = environ[CHOSEN] = str(count)
    if environ.get("OMP_WAIT_POLICY", "").strip().upper() in ("ACTIVE", "PASSIVE"):
        wait_policy = environ["OMP_WAIT_POLICY"].strip().upper()
    else:
        environ.pop("OMP_WAIT_POLICY", None)  # a value OpenMP does not know: the spin count below decides
        environ.setdefault("GOMP_SPINCOUNT", str(SPIN_COUNT))
        wait_policy = f"spin {environ['GOMP_SPINCOUNT']}"
    # Not under a container's CPU quota: /proc/stat counts the whole host, whose other programs do not take this
    # process's share; nor with a thread count the user set.
    adapts = source.startswith("the cores this process may run on") and readable(proc_stat)
    return ThreadSetting(count, wait_policy, source, adapts=adapts)


def readable(path: Path) -> bool:
    try:
        return bool(path.read_text())
    except OSError:
        return False


def keep_freed_memory(environ=os.environ, libc=None) -> str:
    """Raise glibc's mmap and trim thresholds for this process (see the module's docstring); says what was done.
    Nothing when the user set glibc's own variables, or the C library is not glibc (its mallopt is glibc's)."""
    given = [name for name in MALLOC_VARIABLES if name in environ]
    if given:
        return f"freed memory as the user's {', '.join(given)} say"
    done = (threads.mallopt(threads.M_MMAP_THRESHOLD, MMAP_THRESHOLD, libc)
            and threads.mallopt(threads.M_TRIM_THRESHOLD, TRIM_THRESHOLD, libc))
    return (f"freed memory reused (glibc mmap threshold {MMAP_THRESHOLD >> 20} MB, trim {TRIM_THRESHOLD >> 20} MB)"
            if done else "")


SETTING: ThreadSetting | None = None  # what configure() chose for this process; None until a command calls it


def configure() -> ThreadSetting:
    """Tune this process for a command, once (a second call returns the first setting): the thread count and wait
    into the environment (a torch already loaded gets the count set directly), freed memory kept, the pool adapted
    to the machine's load from now on where it may be. `describe()` of what it returns is the line to log."""
    global SETTING
    if SETTING is not None:
        return SETTING
    setting = choose()
    memory = keep_freed_memory()
    torch_first = "torch" in sys.modules
    if torch_first:  # too late for the environment to reach its pool's wait
        import torch

        torch.set_num_threads(setting.threads)
    if setting.adapts:
        threads.start_adapting(setting.threads)
    SETTING = ThreadSetting(setting.threads, setting.wait_policy, setting.source, torch_first, memory, setting.adapts)
    return SETTING
