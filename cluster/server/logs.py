"""The scheduler's half of ``colocate logs``: relaying log tails from the nodes that hold them.

The scheduler opens no file for a log. ``LogRelay.ask`` sends each worker's node a ``LogTailRequest``
(a request id of the relay's own) and keeps the client waiting; ``answer`` takes a node's ``LogTail``
(only from the node it was sent to); when every rank is answered, or ``deadline_s`` has passed
(``expire``, called every tick), the client gets one ``LogsReply`` whose missing ranks carry an error
line. A node that is not connected is named at once. Each worker's share of the reply is bounded
(``per_rank_bytes``) so a reply stays far below the message size limit. No I/O: it returns messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from colocate import protocol as P
from colocate.base.endpoints import LOGS_DEADLINE_S

REPLY_BUDGET_BYTES = 512 << 10  # log text in one LogsReply, shared by its ranks
MIN_RANK_BYTES = 256
MAX_WAITING = 1000  # client requests waiting at once; the oldest is answered (with errors) past this


def per_rank_bytes(ranks: int) -> int:
    return max(MIN_RANK_BYTES, min(P.LOG_TAIL_MAX_BYTES, REPLY_BUDGET_BYTES // max(1, ranks)))


@dataclass
class _Waiting:
    client: bytes
    job_id: str
    deadline: float
    refs: dict[int, P.LogRef | None] = field(default_factory=dict)  # rank -> LogRef (None: not answered yet)
    asked: dict[str, tuple[int, str]] = field(default_factory=dict)  # request id -> (rank, node id)


class LogRelay:
    def __init__(self, deadline_s: float = LOGS_DEADLINE_S):
        self.deadline_s = deadline_s
        self._seq = 0
        self._waiting: dict[int, _Waiting] = {}  # group -> waiting client request
        self._requests: dict[str, int] = {}  # request id -> group

    def ask(self, client: bytes, job_id: str, workers: list[tuple[int, str]], nodes: dict[str, bytes],
            now: float) -> list[tuple[bytes, P.Message]]:
        """Ask the nodes of ``workers`` ([(rank, node id)]) for their logs; ``nodes``: node id -> connection."""
        if len(self._waiting) >= MAX_WAITING:
            out = self._finish(min(self._waiting), "was not heard in time (too many log requests waiting)")
        else:
            out = []
        self._seq += 1
        group = self._seq
        w = self._waiting[group] = _Waiting(client, job_id, now + self.deadline_s)
        size = per_rank_bytes(len(workers))
        for rank, node_id in workers:
            if node_id not in nodes:
                w.refs[rank] = P.LogRef(rank=rank, node_id=node_id, error=f"node {node_id} is down: its log "
                                        "cannot be read now")
                continue
            w.refs[rank] = None
            request_id = f"{group}.{rank}"
            w.asked[request_id] = (rank, node_id)
            self._requests[request_id] = group
            out.append((nodes[node_id], P.LogTailRequest(request_id=request_id, job_id=job_id, rank=rank,
                                                         max_bytes=size)))
        return out + self._reply_if_done(group)

    def answer(self, node_id: str, m: P.LogTail) -> list[tuple[bytes, P.Message]]:
        """A node's ``LogTail``; ignored unless it answers a request sent to that node."""
        group = self._requests.get(m.request_id)
        if group is None:
            return []
        w = self._waiting.get(group)
        if w is None or w.asked.get(m.request_id, (None, None))[1] != node_id:
            return []
        rank, _ = w.asked.pop(m.request_id)
        del self._requests[m.request_id]
        w.refs[rank] = P.LogRef(rank=rank, node_id=node_id, text=m.text, truncated=m.truncated, error=m.error)
        return self._reply_if_done(group)

    def expire(self, now: float) -> list[tuple[bytes, P.Message]]:
        """Answer every client whose deadline has passed, naming the nodes that did not answer."""
        out = []
        for group in [g for g, w in self._waiting.items() if now >= w.deadline]:
            out += self._finish(group, f"did not answer within {self.deadline_s:g} s")
        return out

    def _reply_if_done(self, group: int) -> list[tuple[bytes, P.Message]]:
        return self._finish(group, "") if not self._waiting[group].asked else []

    def _finish(self, group: int, why: str) -> list[tuple[bytes, P.Message]]:
        w = self._waiting.pop(group)
        for request_id, (rank, node_id) in w.asked.items():
            self._requests.pop(request_id, None)
            w.refs[rank] = P.LogRef(rank=rank, node_id=node_id, error=f"node {node_id} {why}")
        logs = tuple(w.refs[r] for r in sorted(w.refs))
        return [(w.client, P.LogsReply(job_id=w.job_id, logs=logs))]
