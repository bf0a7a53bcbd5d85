"""The benches publish the README's figures, so their flags are checked like the product's: every number in range,
--work and --out writable before any run (bench/common.py's check_writable), a failed run or a bug module that does
not load makes the exit status non-zero and is written to --out; bench.scale sizes' --batch-size reaches the runs."""

import json
import sys

import pytest


def refused(capsys, main, *args) -> str:
    """The one line a bench prints (or exits with) when it refuses its arguments; its exit status is not 0."""
    with pytest.raises(SystemExit) as stop:
        main([str(arg) for arg in args])
    message = stop.value.code if isinstance(stop.value.code, str) else capsys.readouterr().err.strip()
    assert stop.value.code not in (0, None) and len(message.splitlines()) == 1, message
    return message


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("not a folder")
    return path


# ---- bench.scale --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, said", [
    (["sizes", "--texts", "0"], "--texts: must be >= 1, got 0"),
    (["sizes", "--texts", "100", "-5"], "--texts: must be >= 1, got -5"),
    (["sizes", "--batch-size", "0"], "--batch-size: must be >= 1, got 0"),
    (["sizes", "--batch-size", "-3"], "--batch-size: must be >= 1, got -3"),
    (["teacher", "--datasets", "nosuch"], "invalid choice: 'nosuch'"),
    (["setup", "nosuch=1"], "setup 'nosuch=1': give a TextDataModule setting as name=value"),
    (["setup", "dataset"], "setup 'dataset': give a TextDataModule setting as name=value"),
    (["setup", "dataset=nosuch"], "error: setup: unknown dataset 'nosuch'"),
])
def test_scale_refuses_bad_flags_in_one_line(capsys, args, said):
    from bench.scale import main

    assert said in refused(capsys, main, *args)


def test_scale_checks_its_work_folder_before_writing_any_set(capsys, monkeypatch, a_file, tmp_path):
    import bench.scale

    monkeypatch.setattr(bench.scale, "write_texts", lambda *a: pytest.fail("a set was written before the refusal"))
    assert "is a file, not a folder" in refused(capsys, bench.scale.main, "sizes", "--texts", "10", "--work",
                                                 a_file / "work")
    assert "exists and is not a folder" in refused(capsys, bench.scale.main, "sizes", "--texts", "10", "--work", a_file)


def test_scale_sizes_batch_size_reaches_the_runs(monkeypatch, tmp_path):
    import bench.scale

    commands = []
    monkeypatch.setattr(bench.scale, "write_texts", lambda path, n, kind: path.write_bytes(b""))
    monkeypatch.setattr(bench.scale, "run_and_watch", lambda command, env=None: commands.append(command) or {
        "marks": [("train", 0, 1, 100, 1.0), ("train", 0, 11, 100, 2.0)], "first_step_peak_mib": 1,
        "peak_rss_mib": 1, "returncode": 0, "seconds": 2.0})
    with pytest.raises(SystemExit) as stop:
        bench.scale.main(["sizes", "--texts", "10", "--batch-size", "8", "--work", str(tmp_path)])
    assert stop.value.code == 0
    (command,) = commands
    at = command.index("--data.batch_size")
    assert command[at + 1] == "8"


# ---- bench.healthy ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("args, said", [
    (["--seeds", "-1"], "--seeds: must be >= 0, got -1"),
    (["--timeout", "-5"], "--timeout: must be a number > 0, got -5"),
    (["--timeout", "0"], "--timeout: must be a number > 0, got 0"),
    (["--datasets", "nosuch"], "--datasets: invalid choice: 'nosuch'"),
    (["--jobs", "0"], "--jobs: must be >= 1, got 0"),
])
def test_healthy_refuses_bad_flags_even_with_dry_run(capsys, args, said):
    from bench.healthy import main

    assert said in refused(capsys, main, "--dry-run", *args)


def test_healthy_checks_work_and_out_before_any_run(capsys, monkeypatch, a_file, tmp_path):
    import bench.healthy

    monkeypatch.setattr(bench.healthy, "execute", lambda *a: pytest.fail("a run started before the refusal"))
    common = ["--configs", "none", "--datasets", "sst2", "--kinds", "full", "--seeds", "0"]
    assert "is a file, not a folder" in refused(capsys, bench.healthy.main, *common, "--work", a_file / "w")
    assert "folder" in refused(capsys, bench.healthy.main, *common, "--work", tmp_path / "w",
                               "--out", a_file / "out.json")
    assert "is a directory" in refused(capsys, bench.healthy.main, *common, "--work", tmp_path / "w",
                                       "--out", tmp_path)


# ---- bench.diagnosis ----------------------------------------------------------------------------------------------


@pytest.fixture
def user_bugs(tmp_path, monkeypatch):
    """A folder of the user's bug modules on sys.path, each broken its own way."""
    modules = {"exits_at_import": "import sys\nsys.exit(3)\n", "syntax_error": "def bug(plant):\n    return (\n",
               "raises_at_import": "raise RuntimeError('boom')\n", "no_function": "x = 1\n",
               "raises_when_planted": "def bug(plant):\n    raise RuntimeError('my bug is broken')\n"}
    for name, code in modules.items():
        (tmp_path / f"{name}.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in modules:
        sys.modules.pop(name, None)


@pytest.fixture
def no_runs(monkeypatch):
    import bench.diagnosis

    def train(*args, **kwargs):
        raise AssertionError("a run started before the refusal")
    monkeypatch.setattr(bench.diagnosis, "fit", train)
    monkeypatch.setattr(bench.diagnosis, "subset_files", train)


@pytest.mark.parametrize("spec, said", [
    ("exits_at_import:bug", "(SystemExit: 3)"),
    ("syntax_error:bug", "(SyntaxError: '(' was never closed"),
    ("raises_at_import:bug", "(RuntimeError: boom)"),
    ("no_function:bug", "has no attribute 'bug'"),
])
def test_diagnosis_with_only_a_bug_that_does_not_load_is_one_line_and_non_zero(capsys, user_bugs, no_runs, spec,
                                                                                said):
    from bench.diagnosis import main

    line = refused(capsys, main, "--quick", "--no-healthy", "--work", user_bugs / "work", "--bugs", spec)
    assert line.startswith(f"error: --bugs {spec}: cannot load it") and said in line and "nothing left" in line


def test_diagnosis_refuses_a_healthy_checkpoint_that_does_not_read(capsys, tmp_path, no_runs):
    from bench.diagnosis import main

    (tmp_path / "bad.ckpt").write_text("junk")
    line = refused(capsys, main, "--quick", "--bugs", "none", "--work", tmp_path / "work", "--healthy-checkpoints",
                   tmp_path / "bad.ckpt")
    assert line.startswith(f"error: {tmp_path / 'bad.ckpt'}: not a checkpoint")


def test_diagnosis_records_a_bug_that_raised_or_did_not_load_in_out_and_exits_1(user_bugs, monkeypatch):
    import bench.diagnosis
    from monitor.catalogue.bugs import Plant

    monkeypatch.setattr(bench.diagnosis, "subset_files", lambda *a, **k: (user_bugs / "t.csv", user_bugs / "v.csv"))
    monkeypatch.setattr(bench.diagnosis, "fit", lambda args, bug, every: (bug.plant(Plant()) if bug else None) or (
        [{"step": 1, "warnings": [], "notes": []}], 0.5, None))
    out = user_bugs / "result.json"
    code = bench.diagnosis.main(["--quick", "--work", str(user_bugs / "work"), "--out", str(out),
                                 "--bugs", "raises_when_planted:bug", "no_function:bug"])
    assert code == 1
    saved = json.loads(out.read_text())
    assert [(f["bug"], f["error"]) for f in saved["failed"]] == [
        ("no_function:bug", "--bugs no_function:bug: cannot load it (AttributeError: module 'no_function' has no "
                            "attribute 'bug')"),
        ("raises_when_planted:bug", "the bug raised RuntimeError: my bug is broken")]
    assert [run["bug"] for run in saved["runs"]] == ["healthy", "healthy"]  # the healthy runs still ran, kept
    assert bench.diagnosis.main(["--merge", str(out)]) == 1  # merged, the left-out runs still count
