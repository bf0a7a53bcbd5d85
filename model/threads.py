"""How many threads torch computes with, and how they wait: chosen once per process, before torch is loaded.

torch runs its operations on an OpenMP thread pool (libgomp). Two of that pool's defaults hurt on a shared
machine, and a laptop always runs something else (a browser, an editor, the test suite):
- its size is every core the machine has, not the cores this process may use (a CPU affinity mask, a container's
  CPU quota), so threads queue for cores they will never get;
- between two operations its threads spin (about 300,000 pause instructions, several milliseconds) before they
  sleep. A spinning thread holds its core while the thread it waits for waits for a core: with one busy program
  beside a 2-core run, training took 4.5× as long, with two 26× (not the 2× that losing a core costs).
So each process uses the cores it may run on (`available_cores`) and waits passively (OMP_WAIT_POLICY=PASSIVE: a
thread with nothing to do sleeps at once), and another program costs about the cores it takes.

OpenMP reads its variables once, when torch's library loads, and only from the environment: every face (train.py,
predict.py, serve.py, diagnose.py, export.py, prune.py, bench/, the tests' conftest.py) imports this module before
anything that loads torch. The setting goes into os.environ, so the processes a run starts (DataLoader workers,
which torch then sets to one thread each; a bench's training runs; serve's workers) inherit it. The user's own
OMP_NUM_THREADS and OMP_WAIT_POLICY (and GOMP_SPINCOUNT) are kept as they are. `log_setting()` logs the one line
that says what was chosen and why, once per process.

This module imports nothing heavy (model/__init__.py loads the network lazily), so importing it loads no torch.
"""

import logging
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

WAIT_POLICY = "PASSIVE"  # when the environment names none
CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" in µs, or "max <period>"


@dataclass(frozen=True)
class ThreadSetting:
    threads: int
    wait_policy: str
    source: str  # where the thread count came from, in words
    torch_first: bool = False  # torch was loaded before this module: its wait policy could no longer change

    def describe(self) -> str:
        wait = f"OMP_WAIT_POLICY {self.wait_policy}"
        if self.torch_first:
            wait += " (not in force: torch was loaded before model.threads, so its pool waits as it did)"
        spin = os.environ.get("GOMP_SPINCOUNT")
        return f"torch threads: {self.threads} ({self.source}); {wait}" + (f", GOMP_SPINCOUNT {spin}" if spin else "")


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


def choose(environ=os.environ, cpu_max: Path = CGROUP_CPU_MAX) -> ThreadSetting:
    """The setting this environment asks for: the user's OMP_NUM_THREADS and OMP_WAIT_POLICY when set, else the
    available cores and a passive wait. Writes the chosen values into `environ`."""
    given = environ.get("OMP_NUM_THREADS")
    threads = requested_threads(given)
    if threads is not None:
        source = "OMP_NUM_THREADS"
    else:
        threads, source = available_cores(cpu_max)
        if given is not None:
            source += f"; OMP_NUM_THREADS {given!r} is not a thread count, so it was replaced"
        environ["OMP_NUM_THREADS"] = str(threads)
    if environ.get("OMP_WAIT_POLICY", "").strip().upper() in ("ACTIVE", "PASSIVE"):
        wait_policy = environ["OMP_WAIT_POLICY"].strip().upper()
    else:
        wait_policy = environ["OMP_WAIT_POLICY"] = WAIT_POLICY
    return ThreadSetting(threads, wait_policy, source)


def configure() -> ThreadSetting:
    """Choose the setting for this process, once; a torch already loaded gets the thread count set directly."""
    setting = choose()
    if "torch" in sys.modules:  # too late for the environment to reach its pool's wait
        import torch

        torch.set_num_threads(setting.threads)
        setting = ThreadSetting(setting.threads, setting.wait_policy, setting.source, torch_first=True)
    return setting


SETTING = configure()
_logged = False


def log_setting() -> ThreadSetting:
    """Log the setting's one line (once per process, however often called) and return it."""
    global _logged
    if not _logged:
        _logged = True
        log.info(SETTING.describe())
    return SETTING
