"""``colocate.base.files``: atomic replacement, by exchange where the system has it, else by rename."""

from __future__ import annotations

import json
import os
import threading

import pytest

from colocate.base import files as F


def test_a_new_file_and_a_replaced_one_hold_the_new_content_and_no_temporary_is_left(tmp_path):
    path = tmp_path / "t.json"
    F.write_json_atomic(str(path), {"n": 1}, compact=True)  # no file there yet: a plain rename
    F.write_json_atomic(str(path), {"n": 2}, mode=0o640, compact=True)  # one there: exchanged where possible
    assert json.loads(path.read_text()) == {"n": 2}
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_replacing_an_existing_file_on_linux_does_not_rename_over_it(tmp_path, monkeypatch):
    fn = F._exchange()
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("a")
    b.write_text("b")
    if not fn or fn(F._AT_FDCWD, bytes(a), F._AT_FDCWD, bytes(b), F._RENAME_EXCHANGE) != 0:
        pytest.skip("no renameat2 exchange on this system or filesystem: os.replace is used")
    assert (a.read_text(), b.read_text()) == ("b", "a")
    a.unlink()
    b.unlink()
    path = tmp_path / "t.json"
    F.write_json_atomic(str(path), {"n": 1})
    before = os.stat(path).st_ino

    def refuse(src, dst):
        raise AssertionError(f"os.replace({src}, {dst}) over an existing file")

    monkeypatch.setattr(F.os, "replace", refuse)
    F.write_json_atomic(str(path), {"n": 2})
    assert json.loads(path.read_text()) == {"n": 2} and os.stat(path).st_ino != before


def test_without_an_exchange_it_falls_back_to_rename(tmp_path, monkeypatch):
    monkeypatch.setattr(F, "_exchange_fn", False)
    path = tmp_path / "t.json"
    for n in range(3):
        F.write_json_atomic(str(path), {"n": n})
    assert json.loads(path.read_text()) == {"n": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_an_unsupported_exchange_is_given_up_once_and_the_file_is_still_replaced(tmp_path, monkeypatch):
    import ctypes
    import errno

    calls = []

    def unsupported(*args):
        calls.append(args)
        ctypes.set_errno(errno.EINVAL)
        return -1

    monkeypatch.setattr(F, "_exchange_fn", unsupported)
    path = tmp_path / "t.json"
    F.write_json_atomic(str(path), {"n": 1})
    F.write_json_atomic(str(path), {"n": 2})
    assert json.loads(path.read_text()) == {"n": 2}
    assert len(calls) == 1 and F._exchange_fn is False


def test_a_reader_never_sees_a_partial_or_missing_file(tmp_path):
    path = tmp_path / "t.json"
    F.write_json_atomic(str(path), {"n": -1, "pad": "x" * 5000}, compact=True)
    stop, seen, bad = threading.Event(), [], []

    def read():
        while not stop.is_set():
            try:
                seen.append(json.loads(path.read_text())["n"])
            except (OSError, ValueError) as exc:
                bad.append(repr(exc))

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for n in range(300):
            F.write_json_atomic(str(path), {"n": n, "pad": "x" * 5000}, compact=True)
    finally:
        stop.set()
        reader.join(10)
    assert bad == [] and seen and seen == sorted(seen)


def test_a_directory_in_the_files_place_is_refused_as_by_rename_and_left_where_it_is(tmp_path):
    path = tmp_path / "t.json"
    path.mkdir()
    with pytest.raises(OSError):
        F.write_json_atomic(str(path), {"n": 1})
    assert path.is_dir()


def test_a_write_that_fails_leaves_no_temporary_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "t.json"
    F.write_json_atomic(str(path), {"n": 1})
    with pytest.raises(TypeError):
        F.write_json_atomic(str(path), {"n": object()})  # not JSON
    assert json.loads(path.read_text()) == {"n": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]
    with pytest.raises(UnicodeEncodeError):
        F.write_text_atomic(str(path), "a\udc80")  # fails in the temporary's write, after it was created
    assert json.loads(path.read_text()) == {"n": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_remove_temporaries_takes_only_the_files_a_dead_writer_left(tmp_path):
    path = tmp_path / "t.json"
    path.write_text("{}")
    (tmp_path / "t.json.tmp.123").write_text("old table")
    (tmp_path / "t.json.tmp.9").write_text("{")
    outside = tmp_path / "outside"
    outside.write_text("keep")
    (tmp_path / "t.json.tmp.77").symlink_to(outside)  # the link goes, its target stays
    (tmp_path / "t.json.tmp.5").mkdir()  # a directory: never
    for keep in ("t.json.tmp.x1", "t.json.tmp.", "u.json.tmp.1", "t.json.tmp"):
        (tmp_path / keep).write_text("keep")
    removed = F.remove_temporaries(str(path))
    assert sorted(os.path.basename(p) for p in removed) == ["t.json.tmp.123", "t.json.tmp.77", "t.json.tmp.9"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["t.json", "outside", "t.json.tmp.5", "t.json.tmp.x1", "t.json.tmp.", "u.json.tmp.1", "t.json.tmp"])
    assert outside.read_text() == "keep"
    assert F.remove_temporaries(str(tmp_path / "missing" / "t.json")) == []
