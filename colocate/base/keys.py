"""ZeroMQ CURVE keys for the scheduler link: who a peer is, and what it may do, comes from its key.

A key folder holds::

    DIR/scheduler.key, DIR/scheduler.key_secret    the scheduler's certificate (public, secret)
    DIR/ROLE-NAME.key, DIR/ROLE-NAME.key_secret    a peer's certificate; ROLE is node, user or operator
    DIR/authorized/ROLE-NAME.key                   the public keys the scheduler lets in

The file name of an admitted key is its identity: ``node-gpu7`` may say ``NodeHello`` as node
``gpu7`` and nothing else; ``user-alice`` submits as user ``alice`` and cancels only alice's jobs;
``operator-bob`` submits as ``bob`` and may cancel any job. Neither users nor operators can register
as nodes, and node keys cannot act as clients. The scheduler reads ``DIR/authorized`` again when it
or any admitted file in it changes (each file's mtime, size and inode, looked at most every
``RELOAD_S``), so a key added while it runs is admitted at the peer's next handshake, a key replaced
in place admits the new key and no longer the old one, and a connection whose key was removed or
replaced is refused from its next message on (``Admitted.current``). A peer whose key is not admitted
gets nothing: the handshake fails and no message of it is delivered.

Modes: key folders are made 0700 and every key file 0600. Before a secret key is used its file and
folder are checked (``check_private``): a secret file others may read, or a folder others may enter or
write, refuses in one line naming the fix (``chmod 600 PATH``, ``chmod 700 DIR``); so does a folder
``authorized`` others may write (they could admit themselves).

Secure by default: without ``--keys`` the scheduler, local nodes and local clients use the user's
folder ``$XDG_CONFIG_HOME/colocate/keys`` (``~/.config/colocate/keys``), created on first use (the
scheduler's certificate, then a node's or the user's own certificate as each first needs it; the
folder is private to its owner, so whoever can write it is that owner). Creation is safe when several
processes start at once: the folder is made aside and renamed into place, and every later change
holds an exclusive lock on ``DIR/.lock``. Running without CURVE takes an explicit ``--insecure``,
refused beyond loopback (``require_keys``).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import ipaddress
import os
import re
import shutil
import socket
import tempfile

from colocate.base.vocab import KeyRole

SERVER = "scheduler"
NODE, USER, OPERATOR = KeyRole.NODE, KeyRole.USER, KeyRole.OPERATOR
ROLES = tuple(KeyRole)
CLIENT_ROLES = (USER, OPERATOR)
AUTHORIZED = "authorized"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
RELOAD_S = 0.1  # the admitted folder is looked at again at most this often


class KeyError_(ValueError):
    """A key folder that cannot be used; ``str()`` is one line naming the missing file."""


# ---------------------------------------------------------------- names


def cert_name(role: str, name: str) -> str:
    """The file stem of a peer's certificate, e.g. ``node-gpu7``; raises KeyError_ for a bad role or name."""
    if role not in ROLES:
        raise KeyError_(f"bad key role {role!r}: one of {', '.join(ROLES)}")
    if not _NAME.match(name or ""):
        raise KeyError_(f"bad key name {name!r}: letters, digits, '.', '-' or '_' (at most 128), not starting "
                        "with '.' or '-'")
    return f"{role}-{name}"


def parse_identity(user_id: str) -> tuple[str, str] | None:
    """``(role, name)`` of a certificate stem or ZAP user id (``node-gpu7`` -> ``("node", "gpu7")``), else None."""
    role, sep, name = (user_id or "").partition("-")
    if not sep or role not in ROLES or not _NAME.match(name):
        return None
    return role, name


# ---------------------------------------------------------------- folders


def default_dir(environ=None) -> str:
    """The key folder used when none is given: ``COLOCATE_KEYS``, else the user's config folder."""
    environ = os.environ if environ is None else environ
    return environ.get("COLOCATE_KEYS") or local_dir(environ)


def local_dir(environ=None) -> str:
    """``$XDG_CONFIG_HOME/colocate/keys``, else ``~/.config/colocate/keys``: made on first use."""
    environ = os.environ if environ is None else environ
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "colocate", "keys")


def resolve(directory: str | None, insecure: bool = False, environ=None) -> str | None:
    """The key folder a daemon or client uses: None with ``insecure``; ``directory`` when given; else
    ``default_dir()``, the user's own folder made (race-safely) when it does not exist yet."""
    if insecure:
        return None
    if directory:
        return directory
    directory = default_dir(environ)
    if directory == local_dir(environ):
        ensure_folder(directory)
    return directory


def ensure_folder(directory: str) -> None:
    """Make ``directory`` with the scheduler's certificate unless it exists. Safe under concurrent callers:
    the folder is built aside and renamed into place; a caller that loses the race uses the winner's."""
    if os.path.isdir(directory):
        return
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, mode=0o700, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".keys-", dir=parent)
    try:
        os.makedirs(os.path.join(tmp, AUTHORIZED), mode=0o700)
        _create(tmp, SERVER)
        try:
            os.rename(tmp, directory)
        except OSError:
            if not os.path.isdir(directory):  # not a lost race
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def _locked(directory: str):
    """An exclusive lock on ``directory/.lock`` (every change to a key folder holds it)."""
    fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def generate_server(directory: str) -> list[str]:
    """Create ``directory`` with the scheduler's certificate and the ``authorized`` folder, unless present.
    Returns the files written. An existing ``directory`` open to others (or not this user's) is refused before
    anything is written in it (``KeyError_``, one line naming the fix): no peer could use keys kept there."""
    import stat

    os.makedirs(directory, mode=0o700, exist_ok=True)
    st = os.stat(directory)
    if st.st_uid not in (os.geteuid(), 0) or st.st_mode & 0o077:
        raise KeyError_(f"refusing to write keys in {directory}: it has mode {stat.S_IMODE(st.st_mode):04o} and uid "
                        f"{st.st_uid}, open to others or not yours: `chmod 700 {directory}`, or name a new folder")
    os.makedirs(os.path.join(directory, AUTHORIZED), mode=0o700, exist_ok=True)
    with _locked(directory):
        return [] if os.path.exists(_secret(directory, SERVER)) else _create(directory, SERVER)


def generate(directory: str, role: str, name: str, exist_ok: bool = False) -> list[str]:
    """Create the scheduler's certificate (unless present) and peer ``role-name``'s, and admit the peer.
    Returns the files written; an existing peer key is an error unless ``exist_ok`` (then it is kept).
    Secret files are readable by their owner only."""
    stem = cert_name(role, name)
    written = generate_server(directory)
    with _locked(directory):
        if os.path.exists(_secret(directory, stem)):
            if not exist_ok:
                raise KeyError_(f"key {stem} already exists in {directory}")
        else:
            written += _create(directory, stem)
        admitted = os.path.join(directory, AUTHORIZED, f"{stem}.key")
        if not os.path.exists(admitted):
            tmp = admitted + ".tmp"
            shutil.copy(os.path.join(directory, f"{stem}.key"), tmp)
            os.rename(tmp, admitted)
            written.append(admitted)
    return written


def _create(directory: str, stem: str) -> list[str]:
    import zmq.auth

    old = os.umask(0o077)  # no moment where a secret is readable by others
    try:
        public, secret = zmq.auth.create_certificates(directory, stem)
    finally:
        os.umask(old)
    os.chmod(secret, 0o600)
    os.chmod(public, 0o600)
    return [public, secret]


def check_private(path: str) -> None:
    """Raise ``KeyError_`` (one line naming the fix) unless the secret key file ``path`` is readable by its
    owner only, in a folder only its owner may enter and write, both this user's or root's."""
    import stat

    folder = os.path.dirname(os.path.abspath(path))
    me = os.geteuid()
    for where, mask, fix in ((path, 0o077, f"chmod 600 {path}"), (folder, 0o077, f"chmod 700 {folder}")):
        try:
            st = os.stat(where)
        except OSError:
            return  # a missing file is _load's one line
        if st.st_uid not in (me, 0):
            raise KeyError_(f"refusing key {path}: {where} belongs to uid {st.st_uid}, not to uid {me}: "
                            f"`chown {me} {where}` if it is yours")
        if st.st_mode & mask:
            raise KeyError_(f"refusing key {path}: {where} has mode {stat.S_IMODE(st.st_mode):04o}, open to others: "
                            f"`{fix}`")


def exists(directory: str, stem: str) -> bool:
    """Whether peer key ``stem`` (``cert_name``) was generated in ``directory``."""
    return os.path.exists(_secret(directory, stem))


def _secret(directory: str, name: str) -> str:
    return os.path.join(directory, f"{name}.key_secret")


def _load(path: str) -> tuple[bytes, bytes | None]:
    import zmq.auth

    if not os.path.exists(path):
        raise KeyError_(f"missing key file {path} (create keys with `colocate keys generate DIR`)")
    if path.endswith(".key_secret"):
        check_private(path)
    try:
        return zmq.auth.load_certificate(path)
    except (ValueError, OSError) as exc:
        raise KeyError_(f"cannot read key file {path}: {exc}") from None


# ---------------------------------------------------------------- which certificate a peer uses


def node_cert(directory: str, node_id: str, environ=None) -> str:
    """The certificate stem node ``node_id`` connects with: ``node-NODE_ID``, made on first use in the
    user's own folder; elsewhere a missing key is an error naming the command that makes it."""
    stem = cert_name(NODE, node_id)
    if not os.path.exists(_secret(directory, stem)):
        if directory != local_dir(environ):
            raise KeyError_(f"missing key file {_secret(directory, stem)}: create it with "
                            f"`colocate keys generate {directory} --node {node_id}`")
        generate(directory, NODE, node_id, exist_ok=True)
    return stem


def client_cert(directory: str, environ=None) -> str:
    """The certificate stem a client connects with: the folder's one ``user-*``/``operator-*`` key, or,
    among several, the OS user's (``operator-USER`` first); in the user's own folder ``user-USER`` is
    made on first use."""
    stems = sorted(f[: -len(".key_secret")] for f in _listdir(directory) if f.endswith(".key_secret"))
    mine = [s for s in stems if (parse_identity(s) or ("",))[0] in CLIENT_ROLES]
    if len(mine) == 1:
        return mine[0]
    me = _os_user()
    for stem in (f"{OPERATOR}-{me}", f"{USER}-{me}"):
        if stem in mine:
            return stem
    if not mine and directory == local_dir(environ) and me:
        generate(directory, USER, me, exist_ok=True)
        return cert_name(USER, me)
    if not mine:
        raise KeyError_(f"no user key in {directory}: create one with `colocate keys generate DIR --user NAME` "
                        "and copy scheduler.key, user-NAME.key and user-NAME.key_secret here (a folder only you may enter: "
                        "mkdir -m 700)")
    raise KeyError_(f"several user keys in {directory} ({', '.join(mine)}) and none is {me!r}'s: keep one")


def _listdir(directory: str) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError as exc:
        raise KeyError_(f"cannot read key folder {directory}: {exc.strerror}") from None


def _os_user() -> str:
    try:
        name = getpass.getuser()
    except (KeyError, OSError):
        return ""
    return name if _NAME.match(name) else ""


# ---------------------------------------------------------------- sockets


def check_server(directory: str) -> None:
    """Raise ``KeyError_`` unless ``directory`` holds what a scheduler needs."""
    _load(_secret(directory, SERVER))
    admitted = os.path.join(directory, AUTHORIZED)
    if not os.path.isdir(admitted):
        raise KeyError_(f"missing folder {admitted} of admitted public keys")
    if os.stat(admitted).st_mode & 0o022:
        raise KeyError_(f"refusing {admitted}: others may write it (and admit themselves): `chmod 700 {admitted}`")


def serve(sock, directory: str) -> None:
    """Make ``sock`` (the scheduler's ROUTER, before bind) a CURVE server."""
    public, secret = _load(_secret(directory, SERVER))
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def connect(sock, directory: str, stem: str) -> None:
    """Give a peer's DEALER (before connect) certificate ``stem`` and the scheduler's public key."""
    public, secret = _load(_secret(directory, stem))
    server_public, _ = _load(os.path.join(directory, f"{SERVER}.key"))
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_public


def user_id(stem: str, z85_key: bytes) -> str:
    """The ZAP user id of a connection: its key's stem and the key (``current`` checks both later)."""
    return f"{stem} {bytes(z85_key).decode('ascii')}"


class Admitted:
    """The admitted public keys of ``DIR/authorized`` by z85 text -> certificate stem, read again when the
    folder or any file in it changes (mtime, size, inode), looked at most every ``reload_s``. Files whose
    name is no ``ROLE-NAME`` are not admitted."""

    def __init__(self, directory: str, reload_s: float = RELOAD_S, clock=None):
        import time

        self.folder = os.path.join(directory, AUTHORIZED)
        self.reload_s, self.clock = reload_s, clock or time.monotonic
        self._stamp: tuple | None = None  # the folder's and each file's (name, mtime_ns, size, inode) when last read
        self._looked = float("-inf")
        self._keys: dict[bytes, str] = {}

    def name_of(self, z85_key: bytes, fresh: bool = True) -> str | None:
        """The stem ``z85_key`` is admitted as (None: not admitted); ``fresh``: look at the folder now (a
        handshake), else at most every ``reload_s`` (every message)."""
        self._refresh(fresh)
        return self._keys.get(bytes(z85_key))

    def current(self, uid: str) -> str | None:
        """The stem of ZAP user id ``uid`` (``user_id``) while its key is still admitted under that name,
        else None (removed, or replaced by another key)."""
        stem, _, key = (uid or "").partition(" ")
        if not key:
            return None
        return stem if self.name_of(key.encode("ascii"), fresh=False) == stem else None

    def _refresh(self, fresh: bool) -> None:
        import zmq.auth

        now = self.clock()
        if not fresh and now - self._looked < self.reload_s and self._stamp is not None:
            return
        self._looked = now
        try:
            st = os.stat(self.folder)
            files = []
            for f in sorted(os.listdir(self.folder)):
                try:
                    fs = os.stat(os.path.join(self.folder, f))
                except OSError:
                    continue
                files.append((f, fs.st_mtime_ns, fs.st_size, fs.st_ino))
        except OSError:
            self._keys, self._stamp = {}, None
            return
        stamp = (st.st_mtime_ns, st.st_ino, tuple(files))
        if stamp == self._stamp:
            return
        keys = {}
        for f, *_ in files:
            stem = f[:-4] if f.endswith(".key") else ""
            if parse_identity(stem) is None:
                continue
            try:
                public, _ = zmq.auth.load_certificate(os.path.join(self.folder, f))
            except (ValueError, OSError):
                continue
            keys[public] = stem
        self._keys, self._stamp = keys, stamp


def start_authenticator(ctx, directory: str):
    """A ZAP handler admitting the keys of ``DIR/authorized``; its ZAP user id (``frame.get("User-Id")`` on
    the server socket) is the key's stem and the key (``user_id``): ``.admitted.current(uid)`` is the stem
    (e.g. ``node-gpu7``) while that key is admitted under it. Call ``.stop()`` at exit."""
    import zmq
    from zmq.auth.thread import ThreadAuthenticator

    admitted = Admitted(directory)

    class _Provider:
        def callback(self, domain, key):
            return admitted.name_of(key) is not None

    class _Auth(ThreadAuthenticator):
        admitted: Admitted

        def curve_user_id(self, client_public_key: bytes) -> str:
            key = zmq.utils.z85.encode(client_public_key)
            stem = admitted.name_of(key)
            return user_id(stem, key) if stem else ""

    auth = _Auth(ctx)
    auth.admitted = admitted
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_Provider())
    return auth


# ---------------------------------------------------------------- where keys are required


def is_loopback(endpoint: str) -> bool:
    """True for ``ipc://``/``inproc://`` endpoints and TCP endpoints on a loopback address."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host in ("localhost",):
        return True
    if host in ("*", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        try:
            return all(ipaddress.ip_address(a[4][0]).is_loopback for a in socket.getaddrinfo(host, None))
        except OSError:
            return False


def require_keys(endpoint: str, directory: str | None) -> None:
    """The rule for every end of the link: without keys (``--insecure``) only on loopback; with keys, a
    scheduler's folder must hold its certificate."""
    if directory is None and not is_loopback(endpoint):
        raise KeyError_(f"refusing {endpoint} beyond loopback without CURVE keys (--insecure is for loopback "
                        "only): drop --insecure, or give --keys DIR (`colocate keys generate`)")
