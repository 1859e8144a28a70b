"""Talking to the scheduler from a program or a command: submit, status, queue, nodes, cancel, logs, recommend.

``SchedulerClient(endpoint=None, keys_dir=None, timeout_s=5.0)``: ``endpoint`` defaults to
``COLOCATE_SCHEDULER`` (else ``tcp://127.0.0.1:5555``), ``keys_dir`` to ``COLOCATE_KEYS``, else the
user's own key folder (``colocate.base.keys.resolve``; made on first use); ``keys_dir=""`` connects without
CURVE (a scheduler started with ``--insecure``; loopback only). The user the scheduler records is the
name of the client's key. A client keeps one connection (``rpc.Connection``: one CURVE handshake, the
key files read once) for all its calls, one at a time; ``close()`` (or ``with``) ends it. Every call is
one request and one reply. Failures raise,
with a one-line ``str()`` for the user: ``rpc.NoAnswer`` (scheduler away, or it refused our keys),
``rpc.BadEndpoint``, ``rpc.BadReply``, ``rpc.TooLarge``, or ``Refused`` for an ``Error`` reply (``.code``
from ``colocate.protocol``; ``unavailable``: the scheduler cannot write its journal, nothing was done).

``submit`` is safe to retry: it mints one request id per call (or takes the caller's) and splits
``timeout_s`` into ``SUBMIT_ATTEMPTS`` tries with that same id (a try with no answer is sent again);
the scheduler makes one job per id, so a lost request or reply never makes a second job, and the
whole call still takes at most ``timeout_s``.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping, Sequence
from typing import TypeVar

from colocate import protocol as P
from colocate.base import endpoints
from colocate.base import keys as K
from colocate.base.commandline import entry_point, python_script
from colocate.base.vocab import JobClass
from colocate.clients import rpc

SUBMIT_ATTEMPTS = 3

_M = TypeVar("_M", bound=P.Message)


class Refused(rpc.RpcError):
    def __init__(self, code: P.ErrorCode, message: str):
        super().__init__(message)
        self.code = code


def request_from_here(command: Sequence[str], *, workers: int = 1, gpus: int = 1, gpu_mem: int = 0,  # noqa: PLR0913 (a request's fields, by name)
                      priority: JobClass = JobClass.GUARANTEED, queue: str = "", name: str = "",
                      estimate_s: float | None = None, environ: Mapping[str, str] | None = None,
                      iterations: int | None = None, epochs: int | None = None,
                      cwd: str | None = None, sm_share: float | None = None,
                      auto: Sequence[str] = (), gpu_model: str = "") -> P.JobRequest:
    """A ``JobRequest`` that runs ``command`` in this process's working directory with its environment,
    minus every ``COLOCATE_*`` variable (a shared filesystem is assumed, as with Slurm).

    Nothing is dropped silently: ``ValueError`` (one line, naming the variable or the limit) for a
    variable over ``P.MAX_ENV_VALUE_CHARS`` characters, or a request whose message would be over
    ``P.MAX_BYTES_OF["submit"]`` (960 KiB, ``check_size``); a ``ProtocolError`` (a ``ValueError``) for any other field out of range."""

    environ = os.environ if environ is None else environ
    env = {k: v for k, v in environ.items() if not k.startswith("COLOCATE_")}
    for k, v in env.items():
        if len(v) > P.MAX_ENV_VALUE_CHARS:
            raise ValueError(f"environment variable {k[:64]} is {len(v)} characters, over the limit of "
                             f"{P.MAX_ENV_VALUE_CHARS} for one variable of a job's environment: unset or shorten it")
    user = _user()
    cwd = cwd or os.getcwd()
    req = P.JobRequest(command=tuple(command), cwd=cwd, env=tuple(env.items()), workers=workers,
                       gpus=gpus, gpu_mem=gpu_mem, priority=priority, queue=queue,
                       name=name or default_name(command)[:P.MAX_ID_CHARS], user=user[:128], estimate_s=estimate_s,
                       iterations=iterations, epochs=epochs, script_hash=script_hash_of(command, cwd),
                       sm_share=sm_share, auto=tuple(auto), gpu_model=gpu_model)
    check_size(req)
    return req


def script_hash_of(command: Sequence[str], cwd: str) -> str:
    """The SHA-256 (hex) of the script ``command`` runs (``python X.py``, or a program given as a path), read from
    ``cwd`` for a relative path: the job's fingerprint is made of it (``JobRequest.script_hash``). "" when the
    command runs no script file (``python -m``, ``-c``, a program on PATH) or the file cannot be read here."""
    import hashlib

    kind, target, _ = entry_point(command)
    if kind != "script" or not target:
        return ""
    h = hashlib.sha256()
    try:
        with open(os.path.join(cwd, target), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError:
        return ""
    return h.hexdigest()


REQUEST_ID_CHARS = 32  # a client's request id (secrets.token_hex(16): 32 hex digits), counted in its Submit


def check_size(req: P.JobRequest) -> None:
    """``ValueError`` (one line: the size, the limit, the largest variables) when ``req`` would not fit a Submit
    (``P.MAX_BYTES_OF``: a message less the room its StartPlacement to a node takes), a request id included;
    checked before anything is sent."""
    import msgpack

    limit = P.MAX_BYTES_OF["submit"]
    size = len(msgpack.packb(P.to_wire(P.Submit(request=req, request_id="0" * REQUEST_ID_CHARS)), use_bin_type=True))
    if size <= limit:
        return
    from colocate.base.units import format_size

    env = dict(req.env)
    largest = sorted(env, key=lambda k: -len(env[k]))[:3]
    raise ValueError(f"the job's request is {format_size(size)}, over the {format_size(limit)} "
                     f"limit of a job's request (one message to the scheduler, then to a node); its environment is "
                     f"{format_size(sum(len(k) + len(v) for k, v in env.items()))} (largest: "
                     f"{', '.join(f'{k[:64]} {format_size(len(env[k]))}' for k in largest)}): unset what the job "
                     "does not need")


def default_name(command: Sequence[str]) -> str:
    """A job's name when none is given: the script of a python command, else the program."""
    prog = os.path.basename(command[0]) if command else "job"
    if prog.startswith("python"):
        script = python_script(list(command[1:]))
        if script and script != "-":
            return os.path.basename(script)
        if "-m" in command[1:]:
            i = list(command).index("-m")
            if i + 1 < len(command):
                return command[i + 1]
    return prog


class SchedulerClient:
    def __init__(self, endpoint: str | None = None, keys_dir: str | None = None, timeout_s: float = 5.0):
        self.endpoint = endpoint or endpoints.scheduler_endpoint()
        self.keys_dir = keys_dir
        self.timeout_s = timeout_s
        self._conn: rpc.Connection | None = None
        self._key_folder: str | None = None

    def _connection(self) -> rpc.Connection:
        if self._conn is None:
            self._key_folder = self._keys()
            self._conn = rpc.Connection(self.endpoint, self._key_folder, peer="scheduler")
        return self._conn

    def close(self) -> None:
        """End the connection (idempotent; the next call opens a new one)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> SchedulerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _keys(self) -> str | None:
        """The key folder (made on first use when it is the user's own), or None for ``keys_dir=""``."""
        try:
            keys = K.resolve(self.keys_dir, insecure=self.keys_dir == "")
            K.require_keys(self.endpoint, keys)
        except (ValueError, OSError) as exc:
            raise rpc.BadEndpoint(str(exc)) from None
        return keys

    def call(self, msg: P.Message, want: type[_M], timeout_s: float | None = None) -> _M:
        """One request, and its reply of type ``want`` (``Refused`` for an ``Error``, ``rpc.BadReply`` for another)."""
        conn = self._connection()
        try:
            reply = conn.request(msg, timeout_s or self.timeout_s)
        except rpc.NoAnswer as exc:  # with CURVE, a scheduler that does not admit our key is silent too
            if self._key_folder:
                exc.args = (f"{exc} (is it running, and does it admit the keys in {self._key_folder}?)",)
            raise
        if isinstance(reply, P.Error):
            raise Refused(reply.code, reply.message)
        if not isinstance(reply, want):
            raise rpc.BadReply(f"unexpected reply {reply.TYPE!r} to {msg.TYPE}")
        return reply

    def submit(self, request: P.JobRequest, request_id: str | None = None) -> str:
        """The new job's id; retried with the same request id when no answer comes (see above)."""
        msg = P.Submit(request=request, request_id=request_id or secrets.token_hex(16))
        attempt = 1
        while True:
            try:
                return self.call(msg, P.Submitted, self.timeout_s / SUBMIT_ATTEMPTS).job_id
            except rpc.NoAnswer:
                if attempt >= SUBMIT_ATTEMPTS:
                    raise
                attempt += 1

    def job(self, job_id: str) -> P.JobView:
        return self.call(P.JobsRequest(job_id=job_id), P.JobsReply).jobs[0]

    def jobs(self, active_only: bool = False) -> tuple[list[P.JobView], dict[str, int]]:
        """Every job (all pages), and pending jobs per queue."""
        out: list[P.JobView] = []
        offset = 0
        while True:
            reply = self.call(P.JobsRequest(active_only=active_only, offset=offset), P.JobsReply)
            out += reply.jobs
            offset += len(reply.jobs)
            if not reply.jobs or offset >= reply.total:
                return out, dict(reply.queued)

    def nodes(self) -> P.NodesReply:
        return self.call(P.NodesRequest(), P.NodesReply)

    def cancel(self, job_id: str) -> str:
        return self.call(P.Cancel(job_id=job_id), P.Ok).message

    def recommend(self, job_id: str | None = None, command: Sequence[str] = (), cwd: str | None = None,
                  workers: int = 1, gpus: int = 1) -> P.RecommendationView:
        """What the scheduler recommends for job ``job_id``, or for ``command`` (its script read from ``cwd`` and
        hashed, as a submit would: ``script_hash_of``)."""
        digest = script_hash_of(command, cwd or os.getcwd()) if command else ""
        msg = P.RecommendRequest(job_id=job_id, command=tuple(command), script_hash=digest, workers=workers, gpus=gpus,
                                 user=_user())
        return self.call(msg, P.RecommendReply).recommendation

    def logs(self, job_id: str, rank: int | None = None) -> list[P.LogRef]:
        """Each worker's log (its end), as the node holding it read it, or an error line per worker."""
        return list(self.call(P.LogsRequest(job_id=job_id, rank=rank), P.LogsReply).logs)


def _user() -> str:
    """This process's user name ("" when it has none): who a request says it is from, where no key says so."""
    import getpass

    try:
        return getpass.getuser()[:128]
    except (KeyError, OSError):
        return ""
