"""colocate/base/keys.py: key files and folders are made private and refused when they are not (issue 22, item 1);
admitted keys reload on any change of an admitted file (item 7)."""

from __future__ import annotations

import os
import stat

import pytest

from colocate.base import keys as K


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_keys_are_made_0600_in_0700_folders(tmp_path):
    keys = tmp_path / "keys"
    K.generate(str(keys), K.USER, "alice")
    assert _mode(keys) == 0o700 and _mode(keys / "authorized") == 0o700
    assert {f.name: _mode(f) for f in keys.iterdir() if f.suffix in (".key", ".key_secret")} == {
        "scheduler.key": 0o600, "scheduler.key_secret": 0o600, "user-alice.key": 0o600, "user-alice.key_secret": 0o600}
    K.check_private(str(keys / "user-alice.key_secret"))  # as made: accepted


@pytest.mark.parametrize("what, mode, fix", [
    ("user-alice.key_secret", 0o644, "`chmod 600 {keys}/user-alice.key_secret`"),
    ("user-alice.key_secret", 0o640, "`chmod 600 {keys}/user-alice.key_secret`"),
    (".", 0o755, "`chmod 700 {keys}`"),
    (".", 0o711, "`chmod 700 {keys}`"),
])
def test_a_looser_mode_refuses_in_one_line_naming_the_fix(tmp_path, what, mode, fix):
    keys = tmp_path / "keys"
    K.generate(str(keys), K.USER, "alice")
    os.chmod(keys / what, mode)
    with pytest.raises(K.KeyError_) as err:
        K.connect(_Sock(), str(keys), "user-alice")
    message = str(err.value)
    assert "\n" not in message and fix.format(keys=keys) in message and f"{mode:04o}" in message


@pytest.mark.parametrize("mode", [0o755, 0o711, 0o777])
def test_keys_are_not_written_into_an_existing_folder_open_to_others(tmp_path, mode):
    """`colocate keys generate DIR` into an existing open folder wrote the scheduler's secret there and said nothing;
    every peer then refused that folder. Now nothing is written and the one line names the fix."""
    keys = tmp_path / "open"
    keys.mkdir()
    os.chmod(keys, mode)
    with pytest.raises(K.KeyError_) as err:
        K.generate(str(keys), K.USER, "alice")
    assert f"{mode:04o}" in str(err.value) and f"chmod 700 {keys}" in str(err.value) and "\n" not in str(err.value)
    assert list(keys.iterdir()) == []
    os.chmod(keys, 0o700)
    K.generate(str(keys), K.USER, "alice")  # once private: made as usual


def test_a_scheduler_refuses_an_authorized_folder_others_may_write(tmp_path):
    keys = tmp_path / "keys"
    K.generate_server(str(keys))
    os.chmod(keys / "authorized", 0o777)
    with pytest.raises(K.KeyError_, match=r"`chmod 700 .*/authorized`"):
        K.check_server(str(keys))


class _Sock:
    """What ``K.connect`` sets on a socket."""


def test_admitted_keys_reload_when_a_file_changes_in_place(tmp_path):
    keys, new = tmp_path / "keys", tmp_path / "new"
    K.generate(str(keys), K.USER, "bob")
    K.generate(str(new), K.USER, "bob")
    old_key, new_key = (K._load(str(d / "user-bob.key"))[0] for d in (keys, new))
    now = [0.0]
    admitted = K.Admitted(str(keys), clock=lambda: now[0])
    assert admitted.name_of(old_key) == "user-bob" and admitted.name_of(new_key) is None
    uid = K.user_id("user-bob", old_key)
    assert admitted.current(uid) == "user-bob"
    folder = keys / "authorized"
    before = folder.stat().st_mtime_ns
    with open(folder / "user-bob.key", "r+b") as f:  # rotated in place: the folder does not change
        f.truncate(0)
        f.write((new / "user-bob.key").read_bytes())
    assert folder.stat().st_mtime_ns == before
    assert admitted.current(uid) == "user-bob"  # an open connection is looked at again after reload_s ...
    now[0] += K.RELOAD_S
    assert admitted.current(uid) is None  # ... then its replaced key is refused
    assert admitted.name_of(new_key) == "user-bob" and admitted.name_of(old_key) is None
    assert admitted.current(K.user_id("user-bob", new_key)) == "user-bob"
    assert admitted.current("user-bob") is None  # a user id without its key is nobody's


def test_generate_with_a_name_that_exists_writes_no_key(tmp_path):
    """`keys generate DIR --node bob --user bob` with user-bob made before: exit 2, and node-bob is not made."""
    from tests import support as S

    keys = tmp_path / "keys"
    assert S.colocate_cli("keys", "generate", keys, "--user", "bob").returncode == 0
    before = sorted(p.name for p in keys.rglob("*"))
    res = S.colocate_cli("keys", "generate", keys, "--node", "bob", "--user", "bob")
    assert res.returncode == 2 and "user-bob already exists" in res.stderr and "nothing was written" in res.stderr
    assert sorted(p.name for p in keys.rglob("*")) == before
