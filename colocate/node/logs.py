"""The node's half of ``colocate logs``: answering the scheduler's ``LogTailRequest`` from its own files.

A request names a job id and a rank; the node answers for the cluster that welcomed it (job ids restart at 1 with
a new scheduler state file, so "job 1" is another job in another cluster: its logs are never shown) and for the
newest placement of the job on this node: the log of worker ``rank`` of the newest placement of the job in its
worker table (running or recently ended), else the newest ``worker-RANK.*.log`` (by modification time) in
``LOG_DIR/CLUSTER/JOB`` (``colocate.node.workers.job_log_folder``: a path it builds itself from the cluster id and
the request's job id, each made one safe path component, as the worker manager made them when it started the
worker). It never follows a symbolic link there nor reads a file with other hard links (the job's folder is its
account's, which could plant one). It answers at most ``max_bytes`` from the end of the file; a missing or
unreadable log is an ``error`` line, never an exception.
"""

from __future__ import annotations

import os
import stat

from colocate import protocol as P
from colocate.node.workers import job_log_folder


def log_file(log_dir: str, cluster_id: str, job_id: str, rank: int) -> str | None:
    """The newest log the worker manager wrote for worker ``rank`` of job ``job_id`` of cluster ``cluster_id``
    (the newest placement's: by modification time), None when there is none."""
    folder = job_log_folder(log_dir, cluster_id, job_id)
    prefix = f"worker-{int(rank)}."
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix) and n.endswith(".log")]
    except OSError:
        return None
    newest: tuple[int, str] | None = None
    for name in names:
        try:
            mtime = os.lstat(os.path.join(folder, name)).st_mtime_ns
        except OSError:
            continue
        if newest is None or (mtime, name) > newest:
            newest = (mtime, name)
    return os.path.join(folder, newest[1]) if newest is not None else None


def tail(path: str, max_bytes: int) -> tuple[str, bool, str]:
    """``(text, truncated, error)``: the last ``max_bytes`` of the regular file ``path``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        return "", False, exc.strerror or str(exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "", False, "not a regular file"
        if st.st_nlink != 1:  # the job's account owns the folder: a hard link it planted is not read
            return "", False, "not a plain log file (it has other links)"
        start = max(0, st.st_size - max_bytes)
        os.lseek(fd, start, os.SEEK_SET)
        data = os.read(fd, max_bytes)
    except OSError as exc:
        return "", False, exc.strerror or str(exc)
    finally:
        os.close(fd)
    text = data.decode("utf-8", errors="replace")[-max_bytes:]
    return text, start > 0, ""


def answer(req: P.LogTailRequest, node_id: str, epoch: int, log_dir: str | None, cluster_id: str | None = "",
           known: str | None = None) -> P.LogTail:
    """The ``LogTail`` for ``req``, asked by the scheduler of ``cluster_id`` (None: no scheduler has welcomed the
    node yet, so no cluster's logs are shown); ``known``: the log the worker table holds for the request (the
    worker manager's ``log_of``), read before any other."""
    if not log_dir:
        return P.LogTail(node_id=node_id, epoch=epoch, request_id=req.request_id, error="this node keeps no logs")
    if cluster_id is None:
        text, truncated, error = "", False, "no scheduler has welcomed this node yet"
    else:
        path = known or log_file(log_dir, cluster_id, req.job_id, req.rank)
        text, truncated, error = tail(path, req.max_bytes) if path else ("", False, "no log file")
    if error:
        error = f"no log of worker {req.rank} of job {req.job_id} on node {node_id}: {error}"
    return P.LogTail(node_id=node_id, epoch=epoch, request_id=req.request_id, text=text, truncated=truncated,
                     error=error[:P.MAX_TEXT_CHARS])
