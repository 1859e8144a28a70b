"""The node's half of ``colocate logs``: answering the scheduler's ``LogTailRequest`` from its own files.

The node reads only ``LOG_DIR/JOB/worker-RANK.log``, a path it builds itself from the request's job id
(made one safe path component, as the worker manager made it when it started the worker) and rank (an
integer), and never follows a symbolic link there nor reads a file with other hard links (the job's folder is
its account's, which could plant one). It answers at most ``max_bytes`` from the end of the
file; a missing or unreadable log is an ``error`` line, never an exception.
"""

from __future__ import annotations

import os
import stat

from colocate import protocol as P
from colocate.node.workers import _safe


def log_file(log_dir: str, job_id: str, rank: int) -> str:
    """Where the worker manager writes worker ``rank`` of job ``job_id``."""
    return os.path.join(log_dir, _safe(job_id), f"worker-{int(rank)}.log")


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


def answer(req: P.LogTailRequest, node_id: str, epoch: int, log_dir: str | None) -> P.LogTail:
    """The ``LogTail`` for ``req``."""
    if not log_dir:
        return P.LogTail(node_id=node_id, epoch=epoch, request_id=req.request_id, error="this node keeps no logs")
    path = log_file(log_dir, req.job_id, req.rank)
    text, truncated, error = tail(path, req.max_bytes)
    if error:
        error = f"no log of worker {req.rank} of job {req.job_id} on node {node_id}: {error}"
    return P.LogTail(node_id=node_id, epoch=epoch, request_id=req.request_id, text=text, truncated=truncated,
                     error=error[:P.MAX_TEXT_CHARS])
