"""ZeroMQ CURVE keys for the scheduler link: generating them, and applying them to sockets.

A key folder (``colocate keys generate DIR``) holds::

    DIR/scheduler.key, DIR/scheduler.key_secret   the scheduler's certificate (public, secret)
    DIR/NAME.key, DIR/NAME.key_secret             a peer's certificate (nodes and clients; NAME "client")
    DIR/authorized/NAME.key                       the public keys the scheduler lets in

The scheduler (``--keys DIR``) serves CURVE with its secret key and admits only peers whose public key
is in ``DIR/authorized``; a peer (``--keys DIR`` or ``COLOCATE_KEYS``) connects with its own
certificate and the scheduler's public key. A peer without a key admitted there gets nothing: the
handshake fails and no message of it is ever delivered. Bound beyond loopback, the scheduler refuses
to start without keys (``require_keys``).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket

SERVER = "scheduler"
DEFAULT_PEER = "client"


class KeyError_(ValueError):
    """A key folder that cannot be used; ``str()`` is one line naming the missing file."""


def generate(directory: str, name: str = DEFAULT_PEER) -> list[str]:
    """Create the scheduler's certificate (unless present) and peer ``name``'s, and authorize the peer.
    Returns the files written. Secret files are readable by their owner only."""
    import zmq.auth

    if not name or "/" in name or name == SERVER:
        raise KeyError_(f"bad key name {name!r}: use letters, digits, '-' or '_', not {SERVER!r}")
    os.makedirs(directory, mode=0o700, exist_ok=True)
    authorized = os.path.join(directory, "authorized")
    os.makedirs(authorized, mode=0o700, exist_ok=True)
    written = []
    for cert in ((SERVER,) if not os.path.exists(_secret(directory, SERVER)) else ()) + (name,):
        public, secret = zmq.auth.create_certificates(directory, cert)
        os.chmod(secret, 0o600)
        written += [public, secret]
    shutil.copy(os.path.join(directory, f"{name}.key"), os.path.join(authorized, f"{name}.key"))
    written.append(os.path.join(authorized, f"{name}.key"))
    return written


def _secret(directory: str, name: str) -> str:
    return os.path.join(directory, f"{name}.key_secret")


def _load(path: str) -> tuple[bytes, bytes | None]:
    import zmq.auth

    if not os.path.exists(path):
        raise KeyError_(f"missing key file {path} (create keys with `colocate keys generate DIR`)")
    try:
        return zmq.auth.load_certificate(path)
    except (ValueError, OSError) as exc:
        raise KeyError_(f"cannot read key file {path}: {exc}") from None


def check_server(directory: str) -> None:
    """Raise ``KeyError_`` unless ``directory`` holds what a scheduler needs."""
    _load(_secret(directory, SERVER))
    if not os.path.isdir(os.path.join(directory, "authorized")):
        raise KeyError_(f"missing folder {os.path.join(directory, 'authorized')} of admitted public keys")


def serve(sock, directory: str) -> None:
    """Make ``sock`` (the scheduler's ROUTER, before bind) a CURVE server."""
    public, secret = _load(_secret(directory, SERVER))
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


def start_authenticator(ctx, directory: str):
    """A ZAP handler that admits the public keys in ``DIR/authorized`` (call ``.stop()`` at exit)."""
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=os.path.join(directory, "authorized"))
    return auth


def connect(sock, directory: str, name: str = DEFAULT_PEER) -> None:
    """Give a peer's DEALER (before connect) its certificate and the scheduler's public key."""
    public, secret = _load(_secret(directory, name))
    server_public, _ = _load(os.path.join(directory, f"{SERVER}.key"))
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = server_public


def default_dir(environ=None) -> str | None:
    """A peer's key folder when none is given: ``COLOCATE_KEYS``, else None (no CURVE)."""
    environ = os.environ if environ is None else environ
    return environ.get("COLOCATE_KEYS") or None


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
    """The scheduler's rule: bound beyond loopback, keys are mandatory."""
    if directory is None and not is_loopback(endpoint):
        raise KeyError_(f"refusing to bind {endpoint} beyond loopback without CURVE keys: give --keys DIR "
                        "(create them with `colocate keys generate DIR`)")
    if directory is not None:
        check_server(directory)
