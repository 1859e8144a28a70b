"""Argument types and options shared by several commands (not a command itself).

Every type turns a bad value into ``argparse.ArgumentTypeError`` with one clear line, so the
command exits 2 with ``colocate CMD: error: ...`` and no traceback.
"""

from __future__ import annotations

import argparse
import sys

from colocate.base.units import parse_duration, parse_fraction, parse_size


def argtype(fn, what: str):
    """An argparse ``type=`` from a parser that raises ValueError; ``what`` names it in errors."""

    def parse(text):
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = what
    return parse


def _int_at_least(lo: int, what: str, hi: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"must be {what} integer, got {text!r}") from None
        if value < lo:
            raise ValueError(f"must be {what} integer, got {text}")
        if hi is not None and value > hi:
            shown = text if len(text) <= 24 else text[:21] + "..."
            raise ValueError(f"must be {what} integer of at most {hi}, got {shown}")
        return value

    return parse


def _identifier(what: str):
    def parse(text: str) -> str:
        from colocate import protocol as P

        if not text:
            raise ValueError(f"an empty {what}")
        if len(text) > P.MAX_ID_CHARS:
            raise ValueError(f"a {what} has at most {P.MAX_ID_CHARS} characters, got {len(text)}")
        return text

    return parse


_nonneg_int = _int_at_least(0, "a non-negative")
_positive_int = _int_at_least(1, "a positive")


def _seconds(lo: float, hi: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"must be a number of seconds, got {text!r}") from None
        if not (lo <= value <= hi):  # also rejects NaN
            raise ValueError(f"must be between {lo:g} and {hi:g} seconds, got {text}")
        return value

    return parse


def _endpoint(text: str) -> str:
    """A ZeroMQ endpoint as colocate uses them: ``tcp://HOST:PORT`` (PORT 1..65535, or ``*`` to bind any),
    ``ipc://PATH`` or ``inproc://NAME``; what ZeroMQ itself refuses is still reported when it is used."""
    scheme, sep, rest = text.partition("://")
    if not text:
        raise ValueError("an empty endpoint")
    if not sep or scheme not in ("tcp", "ipc", "inproc") or not rest:
        raise ValueError(f"expected tcp://HOST:PORT, ipc://PATH or inproc://NAME, got {text[:80]!r}")
    if scheme == "tcp":
        host, colon, port = rest.rpartition(":")
        if not colon or not host:
            raise ValueError(f"expected tcp://HOST:PORT, got {text[:80]!r}")
        if port != "*" and not (port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"the port of {text[:80]!r} must be 1..65535")
    return text


SIZE = argtype(parse_size, "size")
SHARE = argtype(lambda t: parse_fraction(t, "share"), "share")


def _memory(text: str) -> int:
    """A memory size of more than 0 bytes (a GPU of 0 bytes, or a cap of 0 that sends every allocation to host
    memory, is a mistake: leave the option out for the default)."""
    size = parse_size(text)
    if size <= 0:
        raise ValueError("must be more than 0 bytes (leave the option out for the default)")
    return size


MEMORY = argtype(_memory, "size")  # a GPU's memory or a job's cap
NONNEG_INT = argtype(_nonneg_int, "index")
POSITIVE_INT = argtype(_positive_int, "count")
PORT = argtype(lambda t: _check_port(_nonneg_int(t)), "port")
JOB_ID = argtype(_identifier("job id"), "job id")
NODE_ID = argtype(_identifier("node id"), "node id")
ENDPOINT = argtype(_endpoint, "endpoint")
RANK = argtype(lambda t: _int_at_least(0, "a non-negative", _protocol().MAX_WORKERS - 1)(t), "rank")
NODE_GPUS = argtype(lambda t: _int_at_least(1, "a positive", _protocol().MAX_NODE_GPUS)(t), "count")
WORKERS = argtype(lambda t: _int_at_least(1, "a positive", _protocol().MAX_WORKERS)(t), "count")  # a gang's


def _sim_gpus(text: str):
    from colocate.gpus.sim import parse_sim_gpus

    got = parse_sim_gpus(text)
    return len(got) if all(t == ("", 1.0) for t in got) else got


SIM_GPUS = argtype(_sim_gpus, "GPUs")


def _protocol():
    from colocate import protocol

    return protocol


def bounded_int(lo: int, hi: int, what: str):
    """An argparse type for an integer in [lo, hi]; ``what`` names it in errors."""
    return argtype(_int_at_least(lo, "an", hi), what)


def seconds(lo: float, hi: float):
    """An argparse type for a number of seconds in [lo, hi]."""
    return argtype(_seconds(lo, hi), "seconds")


def _check_port(port: int) -> int:
    if not 1 <= port <= 65535:
        raise ValueError(f"must be a TCP port 1..65535, got {port}")
    return port


def add_node_options(p: argparse.ArgumentParser) -> None:
    """``--node`` / ``--ctl`` / ``--timeout``: how an operator command reaches a node."""
    p.add_argument("--node", default=None, type=ENDPOINT, metavar="ENDPOINT",
                   help="the node's job endpoint (default: the one `colocate node` binds by default)")
    p.add_argument("--ctl", default=None, type=ENDPOINT, metavar="ENDPOINT",
                   help="the node's operator endpoint (default: the job endpoint + '.ctl')")
    p.add_argument("--timeout", type=seconds(0.001, 3600), default=2.0, metavar="S",
                   help="seconds to wait for the node's answer (default 2)")


def add_device_options(p: argparse.ArgumentParser, sim_gpus_help: str, typed: bool = False) -> None:
    """``--device`` / ``--sim-gpus`` / ``--sim-gpu-mem`` / ``--policy``: the GPUs a node coordinator owns and
    how it co-locates on them (``colocate node``, and the node ``colocate ray start`` runs)."""
    from colocate.base.env import DEVICE_CHOICES
    from colocate.node.config import POLICY_NAMES

    p.add_argument("--device", default="auto", choices=DEVICE_CHOICES, help="GPU kind (default auto)")
    p.add_argument("--sim-gpus", type=SIM_GPUS if typed else NODE_GPUS, default=1,
                   metavar="N|N:TYPE[@SPEED],..." if typed else "N", help=sim_gpus_help)
    p.add_argument("--sim-gpu-mem", type=MEMORY, default=16 << 30, metavar="SIZE",
                   help="sim: memory of each simulated GPU (default 16GiB)")
    p.add_argument("--policy", default=None, choices=[str(n) for n in POLICY_NAMES],
                   help="co-location policy (default adaptive, or the node's config file's)")


def fail(prog: str, text: str, code: int = 1) -> int:
    """Print ``colocate PROG: TEXT`` on stderr and return ``code``."""
    print(f"colocate {prog}: {text}", file=sys.stderr)
    return code


DURATION = argtype(parse_duration, "duration")


def add_scheduler_options(p: argparse.ArgumentParser) -> None:
    """``--scheduler`` / ``--keys`` / ``--insecure`` / ``--timeout``: how a client reaches the scheduler."""
    p.add_argument("--scheduler", default=None, type=ENDPOINT, metavar="ENDPOINT",
                   help="the scheduler's endpoint (default: $COLOCATE_SCHEDULER, else tcp://127.0.0.1:5555)")
    p.add_argument("--keys", default=None, metavar="DIR",
                   help="CURVE key folder holding scheduler.key and this user's key (`colocate keys generate`; "
                        "default: $COLOCATE_KEYS, else ~/.config/colocate/keys, made on first use)")
    p.add_argument("--insecure", action="store_true",
                   help="no CURVE: for a scheduler started with --insecure, on loopback only")
    p.add_argument("--timeout", type=seconds(0.001, 3600), default=5.0, metavar="S",
                   help="seconds to wait for the scheduler's answer (default 5)")


def scheduler_client(args):
    """The client of ``--scheduler`` (checked when parsed), else of ``$COLOCATE_SCHEDULER``, checked here:
    ``rpc.BadEndpoint`` (exit 2 through ``client_failure``) when it is not an endpoint."""
    from colocate.base import endpoints
    from colocate.clients import rpc
    from colocate.clients.scheduler import SchedulerClient

    endpoint = args.scheduler or endpoints.scheduler_endpoint()
    try:
        _endpoint(endpoint)
    except ValueError as exc:
        raise rpc.BadEndpoint(f"COLOCATE_SCHEDULER: {exc}") from None
    return SchedulerClient(endpoint, "" if args.insecure else args.keys, args.timeout)


def client_failure(prog: str, exc: Exception) -> int:
    """Print a client failure in one line; exit 2 for a request the scheduler found invalid, else 1."""
    from colocate import protocol as P
    from colocate.clients import rpc

    code = getattr(exc, "code", None)
    if isinstance(exc, rpc.BadEndpoint) or code == P.INVALID:
        return fail(prog, f"error: {exc}", 2)
    return fail(prog, f"error: {exc}", 1)
