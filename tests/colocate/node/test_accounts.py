"""colocate/node/accounts.py: which Unix account runs a job's workers (issue 22, item 1), without processes."""

from __future__ import annotations

import getpass
import os

import pytest

from colocate.node.accounts import AccountError, Accounts, read_map, unreachable
from colocate.node.accounts import account as account_of
from tests.users import needs_root, open_dir, users  # noqa: F401 (fixtures)


def test_without_keys_every_job_is_the_nodes(tmp_path):
    assert Accounts(None).for_user("anyone") is None


def test_the_map_names_accounts_refuses_users_and_sets_a_default(tmp_path):
    me = getpass.getuser()
    (tmp_path / "users").write_text(f"# site map\nci {me}  # ci's jobs run as {me}\nmallory -\n")
    accounts = Accounts(str(tmp_path), uid=0)  # as on a root node
    assert accounts.for_user("ci").uid == os.getuid()
    with pytest.raises(AccountError, match="user 'mallory' may not run jobs on this node"):
        accounts.for_user("mallory")
    with pytest.raises(AccountError, match=r"no Unix account 'no-such-acct' .* `no-such-acct ACCOUNT` in"):
        accounts.for_user("no-such-acct")
    (tmp_path / "users").write_text(f"* {me}\n")  # read again as it changes: everyone is {me} now
    assert accounts.for_user("no-such-acct").name == me


def test_a_malformed_map_refuses_in_one_line_naming_the_line(tmp_path):
    (tmp_path / "users").write_text("alice alice\nbob\n")
    with pytest.raises(AccountError) as err:
        read_map(str(tmp_path / "users"))
    assert str(err.value).startswith(f"{tmp_path}/users:2: expected `USER ACCOUNT`") and "\n" not in str(err.value)


@needs_root
def test_a_node_that_is_not_root_runs_only_its_own_accounts_jobs(tmp_path, users):  # noqa: F811
    alice, bob = users.add("na"), users.add("nb")
    as_alice = Accounts(str(tmp_path), uid=users.uid(alice))  # alice's laptop node
    assert as_alice.for_user(alice) is None  # her own key: runs as the node, no switch
    with pytest.raises(AccountError) as err:
        as_alice.for_user(bob)
    assert f"this node runs as {alice} (not root)" in str(err.value) and f"`{bob} {alice}`" in str(err.value)
    (tmp_path / "users").write_text(f"{bob} {alice}\n")  # the owner opts in: bob's jobs run as alice
    assert as_alice.for_user(bob) is None
    root = Accounts(str(tmp_path), uid=0)
    acct = root.for_user(alice)
    assert (acct.uid, acct.home, acct.env()) == (users.uid(alice), account_of(alice).home,
                                                  {"HOME": acct.home, "USER": alice, "LOGNAME": alice})


@needs_root
def test_a_lease_file_closed_to_the_account_is_named(open_dir, users):  # noqa: F811
    acct = account_of(users.add("lz"))
    closed = open_dir / "closed"
    closed.mkdir(mode=0o700)
    (closed / "lease").write_text("{}")
    os.chmod(closed / "lease", 0o644)
    assert unreachable(str(closed / "lease"), acct) == f"{closed} (mode 0700) is closed to account {acct.name}"
    os.chmod(closed, 0o711)
    assert unreachable(str(closed / "lease"), acct) is None
    os.chmod(closed / "lease", 0o600)
    assert "closed to account" in unreachable(str(closed / "lease"), acct)


def test_a_log_planted_as_a_hard_link_or_fifo_is_neither_written_nor_read(tmp_path):
    from colocate.node.accounts import open_log
    from colocate.node.logs import tail

    target = tmp_path / "someone-elses"
    target.write_text("secret\n")
    os.link(target, tmp_path / "worker-0.log")
    with pytest.raises(OSError, match="not a plain log file"):
        open_log(str(tmp_path / "worker-0.log"), None)
    assert target.read_text() == "secret\n"
    assert tail(str(tmp_path / "worker-0.log"), 100) == ("", False, "not a plain log file (it has other links)")
    os.mkfifo(tmp_path / "worker-1.log")
    with pytest.raises(OSError):  # no reader: ENXIO (with a reader: "not a plain log file"); never blocks
        open_log(str(tmp_path / "worker-1.log"), None)
    with open_log(str(tmp_path / "worker-2.log"), None) as f:
        f.write(b"ok\n")
    assert oct(os.stat(tmp_path / "worker-2.log").st_mode & 0o777) == "0o600"


def test_a_caller_in_another_pid_namespace_is_named():
    from colocate.base.peercred import Cred, claims, parse

    assert parse("localhost:1000:1000:4242") == Cred(1000, 1000, 4242)
    assert parse("127.0.0.1:5555") is None  # tcp: no credentials
    assert "another PID namespace" in claims(Cred(1000, 1000, 0), os.getpid())
    assert claims(Cred(os.getuid(), os.getgid(), os.getpid()), os.getpid()) is None
    assert "is not the caller" in claims(Cred(os.getuid(), os.getgid(), os.getpid()), 1)


def test_a_clusters_log_folder_is_the_nodes_own_never_a_link_or_another_accounts(tmp_path):
    """``LOG_DIR/CLUSTER`` (a job's folder is ``LOG_DIR/CLUSTER/JOB``): made by the node, or refused."""
    from colocate.node.accounts import node_folder

    node_folder(str(tmp_path / "c1"))
    st = os.stat(tmp_path / "c1")
    assert st.st_uid == os.geteuid() and st.st_mode & 0o077 in (0, 0o011)  # others may pass through, never list
    node_folder(str(tmp_path / "c1"))  # again: the same folder
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "c2")
    with pytest.raises(OSError, match="is not a folder"):
        node_folder(str(tmp_path / "c2"))
    if os.geteuid() == 0:  # a job folder of the layout before clusters, named like a cluster: its account's
        (tmp_path / "c3").mkdir()
        os.chown(tmp_path / "c3", 54321, 54321)
        with pytest.raises(OSError, match="belongs to uid 54321, not to the node"):
            node_folder(str(tmp_path / "c3"))
