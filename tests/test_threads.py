"""The thread pool's setting (model/threads.py): the cores the process may use and a passive wait, unless the user
set their own; in the environment before torch loads, in every face; logged once."""

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
OMP = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")


def test_unset_means_the_available_cores_and_a_passive_wait(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    environ = {}
    setting = threads.choose(environ, cpu_max=ROOT / "no-such-file")
    assert (setting.threads, setting.wait_policy) == (3, "PASSIVE")
    assert environ == {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "PASSIVE"}  # inherited by child processes
    assert "may run on" in setting.describe() and "PASSIVE" in setting.describe()


def test_the_users_own_variables_are_kept(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    environ = {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "active"}
    setting = threads.choose(environ)
    assert (setting.threads, setting.wait_policy, setting.source) == (5, "ACTIVE", "OMP_NUM_THREADS")
    assert environ == {"OMP_NUM_THREADS": "5", "OMP_WAIT_POLICY": "active"}


def test_a_value_that_is_no_thread_count_is_replaced_and_said(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    environ = {"OMP_NUM_THREADS": "lots", "OMP_WAIT_POLICY": "sometimes"}
    setting = threads.choose(environ, cpu_max=ROOT / "no-such-file")
    assert (setting.threads, setting.wait_policy) == (2, "PASSIVE")
    assert "'lots' is not a thread count" in setting.source and environ["OMP_NUM_THREADS"] == "2"


def test_a_container_quota_caps_the_cores(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")  # 1.5 cores' worth of time
    assert threads.available_cores(cpu_max)[0] == 2
    cpu_max.write_text("max 100000\n")  # no quota
    assert threads.available_cores(cpu_max) == (16, "the cores this process may run on")


def test_this_test_process_got_the_setting_before_torch():
    """conftest.py imports model.threads first: no pytest plugin loaded torch before it."""
    assert not threads.SETTING.torch_first and os.environ["OMP_WAIT_POLICY"] == threads.SETTING.wait_policy


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
def test_a_face_started_bare_loads_torch_with_the_passive_wait_already_set():
    cores = threads.available_cores()[0]
    assert run_face("train") == {"seen": {"OMP_NUM_THREADS": str(cores), "OMP_WAIT_POLICY": "PASSIVE"},
                                 "threads": cores}


@pytest.mark.slow
def test_a_face_keeps_the_users_setting():
    assert run_face("prune", OMP_NUM_THREADS="1", OMP_WAIT_POLICY="ACTIVE") == \
        {"seen": {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"}, "threads": 1}
