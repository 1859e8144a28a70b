"""colocate.base.lease: the lease file a node writes and its launchers watch (issue 22, items 2 and 9)."""
from __future__ import annotations

import json
import os
import stat

import pytest

from colocate.base.lease import LeaseWatch, parse_marker, placement_marker, read_lease, write_lease


def test_the_file_names_the_writer_and_every_epoch_it_covers(tmp_path):
    path = str(tmp_path / "lease")
    write_lease(path, 100.0, 3.0, epoch=9, epochs={4, 9})
    lease = read_lease(path)
    assert (lease.until, lease.grace_s, lease.epoch, lease.epochs) == (100.0, 3.0, 9, frozenset({4, 9}))


def test_a_worker_of_an_incarnation_the_lease_does_not_cover_is_fenced_at_once(tmp_path):
    path = str(tmp_path / "lease")
    write_lease(path, 100.0, 3.0, epoch=9, epochs={4})
    assert LeaseWatch(path, 4).check(50.0) is None  # re-adopted from a table that survived
    why = LeaseWatch(path, 5).check(50.0)  # its table was lost: the new node does not hold it
    assert why is not None and "incarnation 9" in why and "does not hold" in why
    assert LeaseWatch(path, None).check(50.0) is None  # a launcher without a marker: no epoch to check


def test_a_lease_without_epochs_is_not_checked_for_them(tmp_path):
    path = tmp_path / "lease"
    path.write_text(json.dumps({"until": 100.0, "grace_s": 3.0}))  # an older node's file
    assert LeaseWatch(str(path), 5).check(50.0) is None
    assert LeaseWatch(str(path), 5).check(101.0) is not None


def test_a_missing_file_keeps_only_what_was_promised(tmp_path):
    """A deleted state folder: the launcher runs on to the last ``until`` it read, not a moment longer; one that
    never read a lease has no promise."""
    path = tmp_path / "lease"
    assert LeaseWatch(str(path), 1).check(0.0) is not None
    write_lease(str(path), 100.0, 3.0, epoch=1)
    watch = LeaseWatch(str(path), 1)
    assert watch.check(10.0) is None
    path.unlink()
    assert watch.check(99.0) is None
    assert "lapsed" in watch.check(100.5)
    assert watch.grace_s == 3.0


@pytest.mark.parametrize("text", ["", "{", "[]", '{"until": "x", "grace_s": 1}', '{"until": 1e999, "grace_s": 1}',
                                  '{"until": 1, "grace_s": -1}', '{"until": 1, "grace_s": 1, "epochs": [1.5]}',
                                  '{"until": 1, "grace_s": 1, "epochs": 3}', '{"until": 1, "grace_s": 1, "epoch": "2"}'])
def test_a_malformed_lease_reads_as_none(tmp_path, text):
    (tmp_path / "lease").write_text(text)
    assert read_lease(str(tmp_path / "lease")) is None


def test_the_marker_round_trips_and_refuses_what_is_not_one():
    assert parse_marker(placement_marker("c0ffee/12.3", 1795557827542)) == ("c0ffee/12.3", 1795557827542)
    assert parse_marker(placement_marker("12.3", 5)) == ("12.3", 5)
    for bad in (None, "", "12.3", "@5", "12.3@", "12.3@x", "12.3@-1"):
        assert parse_marker(bad) is None


def test_the_file_is_readable_by_every_account_whatever_the_umask(tmp_path):
    """A root node's workers run as their owners' accounts and read the lease; a unit's UMask=0077 must not
    fence them all at once."""
    path = str(tmp_path / "lease")
    old = os.umask(0o077)
    try:
        write_lease(path, 100.0, 3.0, epoch=1)
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
