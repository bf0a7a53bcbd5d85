"""What the machine can do and what else runs on it, for bench/roofline.py: the matrix-product rate, the memory
bandwidth, and busy programs started beside a measurement (always stopped, and stopping themselves when the process
that started them is gone, even after kill -9)."""

import os
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

# A busy program: a Python loop that checks, every million turns, that the process that started it is still there.
BUSY_LOOP = "import os, sys\nparent = int(sys.argv[1])\nwhile os.getppid() == parent:\n    for _ in range(10**6): pass"


def median_seconds(work, repeats: int = 5, least: float = 0.05) -> float:
    """Median seconds of work(), each timing repeating it until at least `least` seconds have passed."""
    work()
    times = []
    for _ in range(repeats):
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < least or count == 0:
            work()
            count += 1
        times.append(elapsed / count)
    return statistics.median(times)


def matmul_gflops(shapes: list[tuple[int, int, int]]) -> float:
    """GFLOPS of F.linear over these (tokens, in, out) shapes together: 2·tokens·in·out each."""
    tensors = [(torch.randn(t, i), torch.randn(o, i)) for t, i, o in shapes]
    seconds = median_seconds(lambda: [F.linear(x, w) for x, w in tensors])
    return sum(2 * t * i * o for t, i, o in shapes) / seconds / 1e9


def bandwidth_gbs(megabytes: int = 256) -> float:
    """GB/s of a large float copy (read + write), past every cache."""
    source = torch.randn(megabytes * 2**20 // 4)
    target = torch.empty_like(source)
    return 2 * source.numel() * 4 / median_seconds(lambda: target.copy_(source), repeats=5) / 1e9


@contextmanager
def busy_programs(count: int):
    """`count` busy Python loops beside this process, stopped on leaving (an exception, Ctrl-C or SIGTERM too)."""
    programs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP, str(os.getpid())]) for _ in range(count)]
    try:
        yield programs
    finally:
        for program in programs:
            program.kill()
        for program in programs:
            program.wait()


def sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt  # so that `finally` stops the busy programs when the bench is terminated
