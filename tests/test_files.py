"""One writer for every file the project writes (data/files.py): a failed write keeps the old file, a bad target is
refused before anything is written, modes are the usual ones."""

import os

import pytest

from data.files import WriteError, write_atomically, write_text


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "page.html"
    target.write_text("the old page")

    def fail(path):
        path.write_text("half a pa")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed\nmore")

    with pytest.raises(WriteError, match=r"page.html: cannot write the report: PytorchStreamWriter failed") as e:
        write_atomically(target, fail, "report")
    assert "\n" not in str(e.value)
    assert target.read_text() == "the old page" and sorted(p.name for p in tmp_path.iterdir()) == ["page.html"]


def test_a_directory_or_the_input_itself_is_refused_as_a_target(tmp_path):
    source = tmp_path / "in.ckpt"
    source.write_bytes(b"input")
    with pytest.raises(WriteError, match="is a directory"):
        write_text(tmp_path, "x", "report")
    with pytest.raises(WriteError, match=r"is the checkpoint's own input"):
        write_text(tmp_path / "." / "in.ckpt", "x", "checkpoint", inputs=[source])
    with pytest.raises(WriteError, match="does not exist"):
        write_text(tmp_path / "missing" / "out", "x")
    assert source.read_bytes() == b"input"


def test_a_new_file_gets_the_usual_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    umask = os.umask(0o022)
    try:
        fresh = write_text(tmp_path / "new.txt", "a")
        kept = tmp_path / "kept.txt"
        kept.write_text("old")
        kept.chmod(0o640)
        write_text(kept, "new")
    finally:
        os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o644 and kept.stat().st_mode & 0o777 == 0o640
    assert kept.read_text() == "new"
