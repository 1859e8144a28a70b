"""colocate/gpus/ledger.py: the file a simulated GPU's jobs share to hold their device bytes to its total."""

import os
import struct
import subprocess
import sys

import pytest

from colocate.gpus import ledger as L

MiB = 1 << 20


def slot_pid(path, i):
    with open(path, "rb") as f:
        f.seek(L.HEAD_BYTES + i * L.SLOT_BYTES)
        return struct.unpack("<i", f.read(4))[0]


def write_slot(path, i, pid, reserved):
    with open(path, "r+b") as f:
        f.seek(L.HEAD_BYTES + i * L.SLOT_BYTES)
        f.write(struct.pack("<iiQ", pid, 0, reserved))


def test_create_makes_a_private_ledger_of_the_gpus_total(tmp_path):
    path = str(tmp_path / "l")
    L.create(path, 64 * MiB)
    assert os.stat(path).st_size == L.SIZE and os.stat(path).st_mode & 0o777 == 0o600
    assert L.read(path) == L.Usage(64 * MiB, {})


def test_a_job_holds_one_slot_and_a_second_attach_of_the_same_process_reuses_it(tmp_path):
    path = str(tmp_path / "l")
    L.create(path, 64 * MiB)
    a, why = L.attach(path, 3 * MiB)
    assert why == "" and a is not None and a.total == 64 * MiB and a.address != 0
    assert L.read(path).reserved == {os.getpid(): 3 * MiB}
    b, _ = L.attach(path, 5 * MiB)
    assert b is not None and b.index == a.index and L.read(path).reserved == {os.getpid(): 5 * MiB}


def test_a_node_restart_keeps_the_running_jobs_slots(tmp_path):
    path = str(tmp_path / "l")
    L.create(path, 64 * MiB)
    L.attach(path, 7 * MiB)
    L.create(path, 32 * MiB)  # the node again (a new total from its options)
    assert L.read(path) == L.Usage(32 * MiB, {os.getpid(): 7 * MiB})


def test_a_slot_of_a_process_that_is_gone_is_taken_again(tmp_path):
    path = str(tmp_path / "l")
    L.create(path, 64 * MiB)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    for i in range(L.SLOTS):
        write_slot(path, i, 1 if i else gone.pid, MiB)  # pid 1 lives as long as the machine
    slot, why = L.attach(path, 2 * MiB)
    assert slot is not None and slot.index == 0 and slot_pid(path, 0) == os.getpid(), why


def test_a_ledger_whose_slots_are_all_held_by_live_processes_is_refused_with_a_reason(tmp_path):
    path = str(tmp_path / "l")
    L.create(path, 64 * MiB)
    for i in range(L.SLOTS):
        write_slot(path, i, 1, MiB)
    slot, why = L.attach(path)
    assert slot is None and f"all {L.SLOTS} slots" in why


@pytest.mark.parametrize("content", [b"", b"x" * 10, b"x" * L.SIZE])
def test_what_is_not_a_ledger_is_refused_by_the_job_and_left_alone_by_the_node(tmp_path, content):
    path = tmp_path / "l"
    if content:
        path.write_bytes(content)
        slot, why = L.attach(str(path))
        assert slot is None and why
    else:
        slot, why = L.attach(str(path))
        assert slot is None and "no ledger" in why
        return
    with pytest.raises(ValueError, match="not a colocate memory ledger"):
        L.create(str(path), MiB)
    assert path.read_bytes() == content


def test_the_node_does_not_take_a_link_or_another_accounts_file(tmp_path):
    target = tmp_path / "t"
    target.write_bytes(b"keep")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(OSError):
        L.create(str(tmp_path / "link"), MiB)
    assert target.read_bytes() == b"keep"
    if os.geteuid() != 0:
        return  # chown to another account needs root
    other = tmp_path / "other"
    other.write_bytes(b"")
    os.chown(other, 65534, 65534)
    with pytest.raises(OSError, match="another account"):
        L.create(str(other), MiB)
    assert other.read_bytes() == b""


def test_remove_if_unused_keeps_a_ledger_a_live_job_holds(tmp_path):
    path = str(tmp_path / "l")
    L.create(path, 64 * MiB)
    write_slot(path, 0, 1, MiB)
    assert not L.remove_if_unused(path) and os.path.exists(path)
    write_slot(path, 0, 0, 0)
    assert L.remove_if_unused(path) and not os.path.exists(path)
    assert not L.remove_if_unused(path)  # gone already


def test_ledger_paths_differ_by_node_and_gpu():
    paths = {L.ledger_path(e, g) for e in ("ipc:///a/node.sock", "ipc:///b/node.sock") for g in (0, 1)}
    assert len(paths) == 4


def test_a_ledger_left_unwritten_by_a_node_killed_while_making_it_is_made_again(tmp_path):
    path = tmp_path / "l"
    path.write_bytes(b"\0" * L.SIZE)  # sized, its head not yet written
    assert L.attach(str(path))[0] is None  # no job takes it as it is
    L.create(str(path), 64 * MiB)
    assert L.read(str(path)) == L.Usage(64 * MiB, {})
