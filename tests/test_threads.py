"""The adaptive pool (model/threads.py): once a command started it (runtime.py), it shrinks while other programs
use the cores and grows back when they leave; the machine's load read from /proc."""

import os

import pytest

from model import threads


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
