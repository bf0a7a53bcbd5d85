"""What the package may do to its process's thread pool and C allocator, and only when called: nothing here runs at
import (a command tunes its process through runtime.py).

- `adapt()`: called from the long loops (every training batch: training/adapt.py; each batch of predict.py and
  diagnose.py; each request of serve.py). Once a command has started it (runtime.py `configure()` →
  `start_adapting`), it shrinks torch's pool to the cores other programs left free over the last second (at once),
  and grows it back when they leave (two looks in a row). With 1 thread nothing waits for a core, so nothing spins
  in vain. In a process no command configured (a user's own script importing `inference`), it does nothing.
- `mallopt()`: glibc's allocator settings, for runtime.py's `keep_freed_memory` and the ReturnFreedMemory callback
  (training/memory.py). (data/cache.py's `return_freed_memory` hands freed memory back after a build: an act, not a
  setting.)

The standard library only: importing it loads no torch.
"""

import ctypes
import logging
import math
import os
import sys
import time
from pathlib import Path

log = logging.getLogger(__name__)

ADAPT_SECONDS = 1.0  # adapt() looks at the machine's load at most this often
PROC_STAT = Path("/proc/stat")  # Linux: the time every core spent busy since boot, in clock ticks
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers (malloc.h)


def is_glibc() -> bool:
    try:
        return sys.platform.startswith("linux") and (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # no confstr, or a platform without that name
        return False


def mallopt(parameter: int, value: int, libc=None) -> bool:
    """glibc's mallopt(parameter, value) for this process; False where the C library is not glibc (other allocators
    hand memory back their own way) or refuses the value."""
    if libc is None:
        if not is_glibc():
            return False
        libc = ctypes.CDLL(None)
    try:
        return bool(libc.mallopt(parameter, value))
    except AttributeError:  # no mallopt in this C library
        return False


def cpu_ticks(proc_stat: Path = PROC_STAT, cpus: set[int] | None = None) -> tuple[int, int]:
    """(clock ticks the cores `cpus` (default: this process's affinity) spent busy, clock ticks this process spent),
    since boot. Busy: user, nice, system, irq, softirq and the hypervisor's steal (guest time is inside user)."""
    cpus = os.sched_getaffinity(0) if cpus is None else cpus
    busy = 0
    for line in proc_stat.read_text().splitlines():
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[:8])
            busy += user + nice + system + irq + softirq + steal
    own = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()  # after "pid (name)": state is field 3
    return busy, int(own[11]) + int(own[12])  # utime, stime


class Adapter:
    """Sizes torch's pool to the cores other programs left free: `cores` less the cores they used since the last
    look (the busy time of the cores this process may run on, the hypervisor's steal included, less this process's
    own), rounded, at least 1.
    A smaller pool is taken at once (threads waiting for a taken core cost the most); a larger one when two looks in
    a row agree, so a load at the edge does not flip it every second."""

    def __init__(self, cores: int, read=cpu_ticks, clock=time.monotonic, seconds: float = ADAPT_SECONDS):
        self.cores, self.read, self.clock, self.seconds = cores, read, clock, seconds
        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.last = None  # (time, busy ticks, own ticks) at the last look
        self.wanted = None  # the size the last look asked for
        self.changes = 0  # sizes taken (adapt(): the first is logged at INFO)
        self.others = 0.0  # cores other programs used between the last two looks

    def size(self, others: float) -> int:
        return max(1, min(self.cores, math.floor(self.cores - others + 0.5)))

    def look(self, current: int) -> int | None:
        """At most once a `seconds`: the pool's size to take now instead of `current`, or None (too soon, or no
        change)."""
        now = self.clock()
        if self.last is not None and now - self.last[0] < self.seconds:
            return None
        try:
            busy, own = self.read()
        except (OSError, ValueError, IndexError):  # /proc gone or unreadable: keep the pool as it is
            return None
        previous, self.last = self.last, (now, busy, own)
        if previous is None:
            return None
        others = max(0.0, ((busy - previous[1]) - (own - previous[2])) / self.hz / max(now - previous[0], 1e-9))
        wanted, self.others = self.size(others), others
        agreed, self.wanted = wanted == self.wanted, wanted
        return wanted if wanted < current or (wanted > current and agreed) else None


_adapter: Adapter | None = None  # set by start_adapting(): a command's choice (runtime.py), never an import's
_pool_checked = False  # whether adapt() has seen that torch's pool is OpenMP's


def start_adapting(cores: int) -> None:
    """From now on adapt() sizes the pool to at most `cores`, fewer while other programs use them. runtime.py's
    configure() calls it for a command that chose its own thread count; a library user's process never adapts."""
    global _adapter, _pool_checked
    _adapter, _pool_checked = Adapter(cores), False


def adapt() -> None:
    """Called from a face's long loops (each batch, each request): at most once a second, resize torch's pool to the
    cores other programs leave free (Adapter). Nothing unless a command started it (runtime.py: not when the user set
    the thread count, nor off Linux), or with a torch whose pool is not OpenMP's (its native pool cannot be resized
    once it has run)."""
    global _adapter, _pool_checked
    if _adapter is None:
        return
    import torch

    if not _pool_checked:
        _pool_checked = True
        if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
            _adapter = None
            return
    size = _adapter.look(torch.get_num_threads())
    if size is None:
        return
    _adapter.changes += 1
    (log.info if _adapter.changes == 1 else log.debug)(
        "torch threads: %d → %d (other programs used %.1f of %d cores over the last second; looked at each second, "
        "changes after this one are logged at DEBUG)", torch.get_num_threads(), size, _adapter.others, _adapter.cores)
    torch.set_num_threads(size)
