"""Which Unix account runs a job's workers on this node, and the credentials a worker is started with.

The job's user is the name of the key it was submitted with (the scheduler's ``JobRequest.user``; with
CURVE no client can choose it). The node maps it to a Unix account:

* ``KEYS/users`` (the node's key folder), one ``USER ACCOUNT`` pair a line (``#`` starts a comment):
  ``alice alice`` runs alice's jobs as account alice, ``ci builder`` runs ci's jobs as ``builder``,
  ``mallory -`` refuses mallory's jobs, and ``* ACCOUNT`` is the account of every user not listed
  (``* -`` refuses them). Without a line for a user (and no ``*``), the account of the same name.
  The file is read again whenever it changes (mtime, size, inode); a malformed line refuses every
  job in one line naming the file and line (a half-read mapping would run jobs as the wrong account);
* a node running as root starts every worker as its account: that account's uid, primary gid and
  supplementary groups, ``HOME``, ``USER`` and ``LOGNAME``; never the node's uid, groups or key folder
  (``COLOCATE_*`` variables, ``COLOCATE_KEYS`` among them, never reach a worker). A user without an
  account refuses the placement in one line (the scheduler fails the job with it);
* a node that is not root cannot change uid: it runs the jobs of the users that map to its own account
  (a single-user machine: the user's own key ``user-LOGIN`` is the node owner's) and refuses the others
  in one line, since their jobs would run with the node owner's files and keys;
* without keys (``--insecure``, loopback only) no name is known: every job runs as the node's own
  account, as on a single-user laptop. Such a node is for one user only.

Worker logs: ``LOG_DIR`` and each cluster's folder ``LOG_DIR/CLUSTER`` (the node's own: one that is not is
refused) are made 0711 (others may pass through, not list them); each job's folder ``LOG_DIR/CLUSTER/JOB``
belongs to the job's account, mode 0700, and each log file to the account, mode 0600, so no other user reads a
job's output and the job itself can write its exit file there. A job's files are scoped by its cluster and
placement (``colocate.node.workers.worker_files``): a new scheduler state file's job 1 never gets the folder or
the files of an old one's job 1, which may be another user's.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass

USERS_FILE = "users"
ANY = "*"
REFUSED = "-"


class AccountError(ValueError):
    """A job that has no account on this node, or a mapping that cannot be read; ``str()`` is one line."""


@dataclass(frozen=True)
class Account:
    """The Unix account a worker runs as."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def env(self) -> dict[str, str]:
        """The variables that say who the process is (they override the submitter's)."""
        return {"HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def read_map(path: str) -> dict[str, str]:
    """``KEYS/users`` as {user: account}; a missing file is an empty map. Raises AccountError (one line)."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise AccountError(f"cannot read the user map {path}: {exc.strerror}") from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise AccountError(f"{path}:{n}: expected `USER ACCOUNT` (or `USER -` to refuse), got {line.strip()!r}")
        out[words[0]] = words[1]
    return out


def account(name: str) -> Account:
    """The account ``name`` of this host (raises KeyError when there is none)."""
    pw = pwd.getpwnam(name)
    return Account(name=pw.pw_name, uid=pw.pw_uid, gid=pw.pw_gid, groups=tuple(os.getgrouplist(pw.pw_name,
                                                                                           pw.pw_gid)),
                   home=pw.pw_dir)


class Accounts:
    """The node's mapping from job users to accounts. ``keys_dir`` None: names are unknown (no CURVE)."""

    def __init__(self, keys_dir: str | None, uid: int | None = None):
        self.path = os.path.join(keys_dir, USERS_FILE) if keys_dir else None
        self.uid = os.geteuid() if uid is None else uid
        self._stamp: tuple | None = None
        self._map: dict[str, str] = {}

    def for_user(self, user: str) -> Account | None:
        """The account to start ``user``'s workers as; None: as the node itself (no switch). Raises
        AccountError with the one-line reason the placement is refused."""
        if self.path is None:
            return None
        mapping = self._mapping()
        name = mapping.get(user, mapping.get(ANY, user))
        if name == REFUSED or not user:
            raise AccountError(f"user {user or '(none)'!r} may not run jobs on this node (see {self.path})")
        try:
            acct = account(name)
        except KeyError:
            raise AccountError(f"user {user!r} has no Unix account {name!r} on this node: create it, or map the "
                               f"user with a line `{user} ACCOUNT` in {self.path}") from None
        if acct.uid == self.uid:
            return None if self.uid != 0 else acct
        if self.uid != 0:
            me = _name_of(self.uid)
            raise AccountError(f"this node runs as {me} (not root), so it runs only {me}'s jobs, not {user}'s "
                               f"(account {name}): run the node as root to run jobs as their owners, or add "
                               f"`{user} {me}` to {self.path} to run them as {me}")
        return acct

    def _mapping(self) -> dict[str, str]:
        assert self.path is not None
        try:
            st = os.stat(self.path)
            stamp: tuple | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except OSError:
            stamp = None
        if stamp != self._stamp or stamp is None:
            self._map, self._stamp = read_map(self.path), stamp
        return self._map


def _name_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


# ---------------------------------------------------------------- files of a job


def log_root(log_dir: str) -> None:
    """Make ``log_dir`` (0711 when others' jobs log under it, else 0700); never widens an existing one."""
    os.makedirs(log_dir, mode=0o711 if os.geteuid() == 0 else 0o700, exist_ok=True)


def node_folder(folder: str) -> None:
    """Make a folder of the node's own under the log folder (a cluster's: ``LOG_DIR/CLUSTER``), with the log
    folder's mode; never widens an existing one. Raises OSError for one that is not a folder (a link) or not the
    node's (a job folder of the layout before clusters, whose account could list or plant what is in it)."""
    try:
        os.mkdir(folder, 0o711 if os.geteuid() == 0 else 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{folder} is not a folder")
    if st.st_uid != os.geteuid():
        raise OSError(f"{folder} belongs to uid {st.st_uid}, not to the node (uid {os.geteuid()})")


def job_folder(folder: str, acct: Account | None) -> None:
    """Make a job's log folder: the account's, 0700 (the node, root, still reads and writes it)."""
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{folder} is not a folder")
    os.chmod(folder, 0o700)
    if acct is not None and (st.st_uid, st.st_gid) != (acct.uid, acct.gid):
        os.chown(folder, acct.uid, acct.gid)


def open_log(path: str, acct: Account | None):
    """Open a worker's log for appending: created 0600, the account's; never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        # the job's account owns the folder: a log it replaced by a hard link or a FIFO is not written to
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            raise OSError(f"{path} is not a plain log file (a link or a FIFO planted in the job's folder?)")
        if acct is not None and st.st_uid not in (acct.uid, os.geteuid()):
            raise OSError(f"{path} belongs to uid {st.st_uid}, not to the job's account {acct.name}")
        os.set_blocking(fd, True)  # the worker's stdout
        os.fchmod(fd, 0o600)
        if acct is not None:
            os.fchown(fd, acct.uid, acct.gid)
    except OSError:
        os.close(fd)
        raise
    return os.fdopen(fd, "ab")


def spawn_kwargs(acct: Account | None) -> dict:
    """``subprocess.Popen`` arguments that start a process as ``acct`` (none: as the node)."""
    if acct is None or acct.uid == os.geteuid():
        return {}
    return {"user": acct.uid, "group": acct.gid, "extra_groups": list(acct.groups)}


def unreachable(path: str, acct: Account | None) -> str | None:
    """Why ``acct`` cannot read ``path`` (a folder on the way that others cannot pass, a file others cannot
    read), else None. A conservative check on the mode bits for "others"; the account's own and its
    groups' bits count too."""
    if acct is None or acct.uid == os.geteuid():
        return None
    path = os.path.abspath(path)
    parts = [path] + [p for p in _parents(path)]
    for i, p in enumerate(parts):
        try:
            st = os.stat(p)
        except OSError as exc:
            return f"{p}: {exc.strerror}"
        need = (stat.S_IROTH, stat.S_IRGRP, stat.S_IRUSR) if i == 0 else (stat.S_IXOTH, stat.S_IXGRP, stat.S_IXUSR)
        if st.st_uid == acct.uid and st.st_mode & need[2]:
            continue
        if st.st_gid in acct.groups and st.st_mode & need[1]:
            continue
        if not st.st_mode & need[0]:
            return f"{p} (mode {stat.S_IMODE(st.st_mode):04o}) is closed to account {acct.name}"
    return None


def _parents(path: str):
    while True:
        parent = os.path.dirname(path)
        if parent == path:
            return
        yield parent
        path = parent
