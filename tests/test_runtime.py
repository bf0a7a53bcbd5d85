"""A command tunes its own process (runtime.py): the cores it may use, a short spin, freed memory kept, a pool that
adapts, unless the user set their own; set by each face's main() before torch loads. Importing the packages changes
nothing in the caller's process."""

import json
import os
import subprocess
import sys

import pytest

import runtime
from conftest import ROOT
from model import threads

FACES = {  # argument lists each face's main() parses, then fails on or answers (loading torch or not)
    "train": ["--help"], "predict": ["--ckpt", "missing.ckpt", "a text"], "serve": ["--ckpt", "missing.ckpt"],
    "export": ["--ckpt", "missing.ckpt", "--out", "unused"], "diagnose": ["--ckpt", "missing.ckpt"],
    "prune": ["--ckpt", "missing.ckpt"],
}
OMP = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", runtime.CHOSEN)
PACKAGES = ("model", "data", "training", "monitor", "inference")


def test_unset_means_the_available_cores_adapted_and_a_short_spin(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    environ = {}
    setting = runtime.choose(environ, cpu_max=ROOT / "no-such-file")
    assert (setting.threads, setting.wait_policy, setting.adapts) == (3, "spin 2000", threads.PROC_STAT.exists())
    # inherited by child processes, which know the count for this module's choice and choose again
    assert environ == {"OMP_NUM_THREADS": "3", runtime.CHOSEN: "3", "GOMP_SPINCOUNT": "2000"}
    assert "may run on" in setting.describe() and "spin 2000" in setting.describe()
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)  # a child on fewer cores
    assert runtime.choose(environ, cpu_max=ROOT / "no-such-file").threads == 1


def test_the_users_own_variables_are_kept_and_their_thread_count_never_adapted(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    environ = {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "active"}
    setting = runtime.choose(environ)
    assert (setting.threads, setting.wait_policy, setting.source, setting.adapts) == \
        (5, "ACTIVE", "OMP_NUM_THREADS", False)
    assert environ == {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "active"}
    environ = {"GOMP_SPINCOUNT": "0"}
    assert runtime.choose(environ).wait_policy == "spin 0" and environ["GOMP_SPINCOUNT"] == "0"


def test_a_value_that_is_no_thread_count_is_replaced_and_said(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    environ = {"OMP_NUM_THREADS": "lots", "OMP_WAIT_POLICY": "sometimes"}
    setting = runtime.choose(environ, cpu_max=ROOT / "no-such-file")
    assert (setting.threads, setting.wait_policy) == (2, "spin 2000")
    assert "'lots' is not a thread count" in setting.source and environ["OMP_NUM_THREADS"] == "2"
    assert "OMP_WAIT_POLICY" not in environ  # OpenMP would not know "sometimes"


def test_no_readable_load_means_a_fixed_pool(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert not runtime.choose({}, proc_stat=ROOT / "no-such-file").adapts


def test_a_container_quota_caps_the_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")  # 1.5 cores' worth of time
    assert runtime.available_cores(cpu_max)[0] == 2
    cpu_max.write_text("max 100000\n")  # no quota
    assert runtime.available_cores(cpu_max) == (16, "the cores this process may run on")


def test_a_container_quota_is_not_adapted(tmp_path, monkeypatch):
    """/proc/stat counts the whole host, whose other programs do not take a container's CPU quota."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("200000 100000\n")
    setting = runtime.choose({}, cpu_max=cpu_max)
    assert setting.threads == 2 and not setting.adapts


def test_this_test_process_got_the_setting_before_torch():
    """conftest.py configures first: no pytest plugin loaded torch before it; a second call changes nothing."""
    setting = runtime.configure()
    assert not setting.torch_first and runtime.configure() is setting
    assert setting.wait_policy == f"spin {os.environ['GOMP_SPINCOUNT']}"


WATCH = """
import json, os, sys
seen = {}
class Watch:  # records the environment at the moment torch is first imported
    def find_spec(self, name, path, target=None):
        if name == "torch" and not seen:
            seen.update({key: os.environ.get(key) for key in %r})
sys.meta_path.insert(0, Watch())
import %s as face
try:
    face.main(%r)
except SystemExit:
    pass
import torch
print(json.dumps({"seen": seen, "threads": torch.get_num_threads()}))
"""


def run_face(face: str, **environ) -> dict:
    env = {key: value for key, value in os.environ.items() if key not in OMP} | environ
    result = subprocess.run([sys.executable, "-c", WATCH % (OMP, face, FACES[face])], cwd=ROOT, env=env,
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("face", FACES)
def test_a_face_started_bare_loads_torch_with_the_short_spin_already_set(face):
    cores = runtime.available_cores()[0]
    assert run_face(face) == {"seen": {"OMP_NUM_THREADS": str(cores), "OMP_WAIT_POLICY": None,
                                       "GOMP_SPINCOUNT": "2000", runtime.CHOSEN: str(cores)}, "threads": cores}


@pytest.mark.slow
def test_a_face_keeps_the_users_setting():
    assert run_face("prune", OMP_NUM_THREADS="1", OMP_WAIT_POLICY="ACTIVE") == \
        {"seen": {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": None, runtime.CHOSEN: None},
         "threads": 1}


# A library user's process: torch at one thread, some environment of theirs, then every module of the packages.
# Observed: the thread count, what our code writes into os.environ or calls in the C library through ctypes (mallopt,
# malloc_trim; libraries' own, such as Lightning's PYTORCH_NVML_BASED_CUDA_CHECK, are theirs), whether adapt() would
# resize the pool, and whether glibc still serves a large block with fresh pages (the mmap threshold runtime.py
# raises). With CONFIGURE, runtime.configure() runs after the imports: the check sees a process that was tuned.
IMPORTS = """
import ctypes, importlib, json, os, pkgutil, sys, sysconfig
import torch
torch.set_num_threads(1)
os.environ["USER_SETTING"] = "kept"
ROOT, STDLIB = %r, sysconfig.get_paths()["stdlib"]
ours = []
def caller():  # the nearest frame outside the standard library (os.environ's and ctypes' own code)
    frame = sys._getframe(2)
    while frame and (frame.f_code.co_filename.startswith((STDLIB, "<frozen"))
                     or "/ctypes/" in frame.f_code.co_filename):
        frame = frame.f_back
    name = frame.f_code.co_filename if frame else ""
    return name if name.startswith(ROOT) and "site-packages" not in name else None
def watch(cls, method):
    original = getattr(cls, method)
    def watched(self, name, *rest):
        if caller():
            ours.append([method, str(name), caller()])
        return original(self, name, *rest)
    setattr(cls, method, watched)
for cls, method in ((os._Environ, "__setitem__"), (os._Environ, "__delitem__"), (ctypes.CDLL, "__getitem__")):
    watch(cls, method)
for package in %r:
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        importlib.import_module(info.name)
if %r:
    import runtime
    runtime.configure()
import model.threads
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
mapped = None
if hasattr(libc, "mallinfo2"):
    libc.mallinfo2.restype = Info
    start = libc.mallinfo2().hblkhd
    block = bytearray(20 << 20)
    mapped = libc.mallinfo2().hblkhd - start >= 20 << 20
print(json.dumps({"threads": torch.get_num_threads(), "ours": ours, "mapped": mapped,
                  "user_setting": os.environ.get("USER_SETTING"), "adapts": model.threads._adapter is not None}))
"""


def import_everything(configure: bool) -> dict:
    env = {key: value for key, value in os.environ.items()
           if key not in OMP and key not in runtime.MALLOC_VARIABLES} | {"OMP_NUM_THREADS": "2"}
    result = subprocess.run([sys.executable, "-c", IMPORTS % (str(ROOT), PACKAGES, configure)], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.slow
def test_importing_the_packages_changes_nothing_in_the_callers_process():
    untouched = import_everything(configure=False)
    assert untouched == {"threads": 1, "ours": [], "mapped": untouched["mapped"], "user_setting": "kept",
                         "adapts": False}
    assert untouched["mapped"] in (True, None)  # glibc's own threshold: 20 MB come as fresh pages (None: no glibc)
    # What the check sees in a process tuned as a command tunes it (the user's OMP_NUM_THREADS of 2 kept)
    tuned = import_everything(configure=True)
    assert tuned["threads"] == 2 and tuned["adapts"] is False and tuned["mapped"] in (False, None)
    assert {(method, name) for method, name, _ in tuned["ours"]} >= {("__getitem__", "mallopt"),
                                                                     ("__setitem__", "GOMP_SPINCOUNT")}


def test_adapt_does_nothing_until_a_command_starts_it(monkeypatch):
    import torch

    monkeypatch.setattr(threads, "_adapter", None)
    before = torch.get_num_threads()
    threads.adapt()
    assert torch.get_num_threads() == before
    threads.start_adapting(3)
    assert threads._adapter.cores == 3


class FakeLibc:
    def __init__(self):
        self.calls = []

    def mallopt(self, parameter, value):
        self.calls.append((parameter, value))
        return 1


def test_freed_memory_is_kept_for_reuse_through_mallopt():
    libc = FakeLibc()
    said = runtime.keep_freed_memory({}, libc)
    assert libc.calls == [(threads.M_MMAP_THRESHOLD, runtime.MMAP_THRESHOLD),
                          (threads.M_TRIM_THRESHOLD, runtime.TRIM_THRESHOLD)]
    assert said.startswith("freed memory reused") and "32 MB" in said


def test_the_users_malloc_variables_are_kept_and_named():
    libc = FakeLibc()
    said = runtime.keep_freed_memory({"MALLOC_TRIM_THRESHOLD_": "0", "MALLOC_ARENA_MAX": "2"}, libc)
    assert libc.calls == [] and said == "freed memory as the user's MALLOC_TRIM_THRESHOLD_ say"
    assert runtime.keep_freed_memory({}, object()) == ""  # a C library without mallopt: nothing done, nothing said


MMAPPED = """
import ctypes, json
import runtime
said = runtime.configure().describe()
class Info(ctypes.Structure):  # glibc's struct mallinfo2
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                                     "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
before = libc.mallinfo2().hblkhd
block = bytearray(20 << 20)  # 20 MB: glibc's default serves it with fresh pages of its own (mmap)
print(json.dumps({"mmapped": libc.mallinfo2().hblkhd - before, "said": said}))
"""


@pytest.mark.skipif(not threads.is_glibc(), reason="the setting is glibc's")
def test_a_command_serves_a_large_block_from_its_heap_unless_the_user_says_otherwise():
    """In force in a fresh process: 20 MB come from the heap, where a freed block is reused, not from fresh pages
    given back at once; with the user's own MALLOC_MMAP_THRESHOLD_ glibc does as they say (the check can tell)."""
    def child(**environ):
        env = {k: v for k, v in os.environ.items() if k not in runtime.MALLOC_VARIABLES} | environ
        result = subprocess.run([sys.executable, "-c", MMAPPED], cwd=ROOT, env=env, capture_output=True, text=True,
                                check=True)
        return json.loads(result.stdout.splitlines()[-1])

    ours, theirs = child(), child(MALLOC_MMAP_THRESHOLD_="131072")
    assert ours["mmapped"] == 0 and "freed memory reused" in ours["said"]
    assert theirs["mmapped"] >= 20 << 20 and "MALLOC_MMAP_THRESHOLD_" in theirs["said"]
