"""The thread pool's setting (model/threads.py): the cores the process may use, a short spin, and a pool that shrinks
while other programs use the cores, unless the user set their own; in the environment before torch loads, in every
face; logged once. Freed memory kept for reuse (glibc)."""

import ast
import json
import logging
import os
import subprocess
import sys

import pytest

from conftest import ROOT
from model import threads

FACES = ("train", "predict", "serve", "diagnose", "export", "prune")
OMP = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", threads.CHOSEN)


def test_unset_means_the_available_cores_adapted_and_a_short_spin(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    environ = {}
    setting = threads.choose(environ, cpu_max=ROOT / "no-such-file")
    assert (setting.threads, setting.wait_policy, setting.adapts) == (3, "spin 2000", threads.PROC_STAT.exists())
    # inherited by child processes, which know the count for this module's choice and choose again
    assert environ == {"OMP_NUM_THREADS": "3", threads.CHOSEN: "3", "GOMP_SPINCOUNT": "2000"}
    assert "may run on" in setting.describe() and "spin 2000" in setting.describe()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)  # a child on fewer cores
    assert threads.choose(environ, cpu_max=ROOT / "no-such-file").threads == 1


def test_the_users_own_variables_are_kept_and_their_thread_count_never_adapted(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    environ = {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "active"}
    setting = threads.choose(environ)
    assert (setting.threads, setting.wait_policy, setting.source, setting.adapts) == \
        (5, "ACTIVE", "OMP_NUM_THREADS", False)
    assert environ == {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "active"}
    environ = {"GOMP_SPINCOUNT": "0"}
    assert threads.choose(environ).wait_policy == "spin 0" and environ["GOMP_SPINCOUNT"] == "0"


def test_a_value_that_is_no_thread_count_is_replaced_and_said(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    environ = {"OMP_NUM_THREADS": "lots", "OMP_WAIT_POLICY": "sometimes"}
    setting = threads.choose(environ, cpu_max=ROOT / "no-such-file")
    assert (setting.threads, setting.wait_policy) == (2, "spin 2000")
    assert "'lots' is not a thread count" in setting.source and environ["OMP_NUM_THREADS"] == "2"
    assert "OMP_WAIT_POLICY" not in environ  # OpenMP would not know "sometimes"


def test_no_readable_load_means_a_fixed_pool(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert not threads.choose({}, proc_stat=ROOT / "no-such-file").adapts


def test_a_container_quota_caps_the_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")  # 1.5 cores' worth of time
    assert threads.available_cores(cpu_max)[0] == 2
    cpu_max.write_text("max 100000\n")  # no quota
    assert threads.available_cores(cpu_max) == (16, "the cores this process may run on")


def test_this_test_process_got_the_setting_before_torch():
    """conftest.py imports model.threads first: no pytest plugin loaded torch before it."""
    assert not threads.SETTING.torch_first
    assert threads.SETTING.wait_policy == f"spin {os.environ['GOMP_SPINCOUNT']}"


def test_the_setting_is_logged_once(caplog, monkeypatch):
    monkeypatch.setattr(threads, "_logged", False)
    with caplog.at_level(logging.INFO, logger="model.threads"):
        threads.log_setting()
        threads.log_setting()
    assert [r.getMessage() for r in caplog.records] == [threads.SETTING.describe()]


def first_import_of_torch_or_ours(path) -> str:
    for node in ast.parse(path.read_text()).body:
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) else []
        for name in names:
            if name.split(".")[0] in ("torch", "lightning", "model", "data", "training", "inference", "monitor",
                                      "bench", "litserve"):
                return name
    return ""


@pytest.mark.parametrize("face", [*(f"{face}.py" for face in FACES), "bench/__init__.py", "tests/conftest.py"])
def test_every_face_sets_the_pool_before_it_loads_torch_or_ours(face):
    assert first_import_of_torch_or_ours(ROOT / face) == "model.threads"


WATCH = """
import json, os, sys
seen = {}
class Watch:  # records the environment at the moment torch is first imported
    def find_spec(self, name, path, target=None):
        if name == "torch" and not seen:
            seen.update({key: os.environ.get(key) for key in %r})
sys.meta_path.insert(0, Watch())
import %s
import torch
print(json.dumps({"seen": seen, "threads": torch.get_num_threads()}))
"""


def run_face(face: str, **environ) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in OMP} | environ
    result = subprocess.run([sys.executable, "-c", WATCH % (OMP, face)], cwd=ROOT, env=env, capture_output=True,
                            text=True, check=True)
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.slow
def test_a_face_started_bare_loads_torch_with_the_short_spin_already_set():
    cores = threads.available_cores()[0]
    assert run_face("train") == {"seen": {"OMP_NUM_THREADS": str(cores), "OMP_WAIT_POLICY": None,
                                          "GOMP_SPINCOUNT": "2000", threads.CHOSEN: str(cores)}, "threads": cores}


@pytest.mark.slow
def test_a_face_keeps_the_users_setting():
    assert run_face("prune", OMP_NUM_THREADS="1", OMP_WAIT_POLICY="ACTIVE") == \
        {"seen": {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None, threads.CHOSEN: None},
         "threads": 1}


class FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, parameter, value):
        self.calls.append((parameter, value))
        return 1


def test_freed_memory_is_kept_for_reuse_through_mallopt():
    libc = FakeLibc()
    said = threads.keep_freed_memory({}, libc)
    assert libc.calls == [(threads.M_MMAP_THRESHOLD, threads.MMAP_THRESHOLD),
                          (threads.M_TRIM_THRESHOLD, threads.TRIM_THRESHOLD)]
    assert said.startswith("freed memory reused") and "32 MB" in said


def test_the_users_malloc_variables_are_kept_and_named():
    libc = FakeLibc()
    said = threads.keep_freed_memory({"MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_ARENA_MAX": "2"}, libc)
    assert libc.calls == [] and said == "freed memory as the user's MALLOC_TRIM_THRESHOLD_ say"
    assert threads.keep_freed_memory({}, object()) == ""  # a C library without mallopt: nothing done, nothing said


MMAPPED = """
import ctypes, json
import model.threads
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
before = libc.mallinfo2().hblkhd
block = bytearray(20 << 20)  # 20 MB: glibc's default serves it with fresh pages of its own (mmap)
print(json.dumps({"mmapped": libc.mallinfo2().hblkhd - before, "said": model.threads.SETTING.describe()}))
"""


@pytest.mark.skipif(not threads.is_glibc(), reason="the setting is glibc's")
def test_a_process_serves_a_large_block_from_its_heap_unless_the_user_says_otherwise():
    """In force in a fresh process: 20 MB come from the heap, where a freed block is reused, not from fresh pages
    given back at once; with the user's own MALLOC_MMAP_THRESHOLD_ glibc does as they say (the check can tell)."""
    def child(**environ):
        env = {k: v for k, v in os.environ.items() if k not in threads.MALLOC_VARIABLES} | environ
        result = subprocess.run([sys.executable, "-c", MMAPPED], cwd=ROOT, env=env, capture_output=True, text=True,
                                check=True)
        return json.loads(result.stdout.splitlines()[-1])

    ours, theirs = child(), child(MALLOC_MMAP_THRESHOLD_="131072")
    assert ours["mmapped"] == 0 and "freed memory reused" in ours["said"]
    assert theirs["mmapped"] >= 20 << 20 and "MALLOC_MMAP_THRESHOLD_" in theirs["said"]


class Machine:
    """Clock ticks as /proc would count them: `others` and `own` cores busy, at 100 ticks a second."""

    def __init__(self):
        self.now, self.busy, self.own = 0.0, 0, 0

    def run(self, seconds: float, others: float, own: float):
        self.now += seconds
        self.busy += round(100 * seconds * (others + own))
        self.own += round(100 * seconds * own)

    def read(self):
        return self.busy, self.own


def test_the_pool_shrinks_to_the_cores_others_leave_and_grows_back():
    machine = Machine()
    adapter = threads.Adapter(4, read=machine.read, clock=lambda: machine.now)
    adapter.hz = 100
    pool = 4
    assert adapter.look(pool) is None  # the first look: nothing to compare with yet
    sizes = []
    for others in (0.1, 0.1, 1.1, 1.1, 3.0, 0.4, 0.4, 2.2, 1.1, 1.1, 0.2, 0.2):
        machine.run(1.0, others=others, own=2.0)
        size = adapter.look(pool)
        sizes.append(size)
        pool = size or pool
    # smaller at once, larger when two looks in a row agree; this process's own busy time is not others'
    assert sizes == [None, None, 3, None, 1, None, 4, 2, None, 3, None, 4]
    assert adapter.size(0.6) == 3 and adapter.size(0.4) == 4 and adapter.size(9.0) == 1
    machine.run(0.5, others=9.0, own=2.0)
    assert adapter.look(pool) is None and adapter.last[0] == machine.now - 0.5  # too soon: not looked at


def test_a_load_that_cannot_be_read_leaves_the_pool_as_it_is():
    def unreadable():
        raise OSError("no /proc")

    adapter = threads.Adapter(2, read=unreadable, clock=iter(range(0, 100, 5)).__next__)
    assert [adapter.look(2) for _ in range(3)] == [None, None, None]


def test_only_the_cores_this_process_may_run_on_count(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  70 0 7 100 0 0 0 0 0 0\ncpu0 10 0 1 50 0 0 0 0 0 0\ncpu1 20 0 2 50 0 0 0 0 0 0\n"
                    "cpu2 40 0 4 0 9 0 0 5 0 0\nintr 1 2 3\n")
    assert threads.cpu_ticks(stat, cpus={0, 1})[0] == 33 and threads.cpu_ticks(stat, cpus={2})[0] == 49


def test_a_container_quota_is_not_adapted(tmp_path, monkeypatch):
    """/proc/stat counts the whole host, whose other programs do not take a container's CPU quota."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("200000 100000\n")
    setting = threads.choose({}, cpu_max=cpu_max)
    assert setting.threads == 2 and not setting.adapts


@pytest.mark.skipif(not threads.PROC_STAT.exists(), reason="the machine's load is read from Linux's /proc/stat")
def test_cpu_ticks_reads_this_machine_and_this_process():
    import time

    busy, own = threads.cpu_ticks()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # 0.3 s of this process's own CPU time
        pass
    busy2, own2 = threads.cpu_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    assert own2 - own >= 0.2 * hz and busy2 - busy >= own2 - own - 2


class Looks:
    """A stand-in Adapter whose looks ask for `size` threads, counting them."""

    def __init__(self, size):
        self.size, self.calls, self.changes, self.others, self.cores = size, [], 0, 1.0, 2

    def look(self, current):
        self.calls.append(current)
        return self.size


def test_prediction_and_every_training_loop_adapt_the_pool(monkeypatch):
    import torch

    from conftest import tiny_classifier
    from training.adapt import AdaptThreads
    from training.module import ClassifierModule

    before = torch.get_num_threads()
    looks = Looks(size=max(1, before - 1) if before > 1 else 2)
    monkeypatch.setattr(threads, "_adapter", looks)
    try:
        tiny_classifier().predict(["one two three"] * 3, batch_size=2)  # two batches: two looks
        assert len(looks.calls) == 2 and torch.get_num_threads() == looks.size
        callback = next(c for c in ClassifierModule().configure_callbacks() if isinstance(c, AdaptThreads))
        for hook in ("on_train_batch_start", "on_validation_batch_start", "on_test_batch_start",
                     "on_predict_batch_start"):
            getattr(callback, hook)(None, None, None, 0)
        assert len(looks.calls) == 6
    finally:
        torch.set_num_threads(before)
