"""Driving a ``SchedulerService`` in-process: a fake clock, fake nodes and a client identity."""

from __future__ import annotations

import random

from cluster.config_file import resolve
from cluster.core import SchedulerCore
from cluster.server.journal import Journal
from cluster.server.service import SchedulerService
from colocate import protocol as P

GiB = 1 << 30
CLIENT = b"client-1"


class Harness:
    """One service on a journal file; ``restart()`` builds a fresh one on the same file (a crash)."""

    def __init__(self, path, policy: str = "gang-binpack", t0: float = 1_000_000.0, batched: bool = False):
        """``batched``: every message goes through ``on_batch`` (a batch of one, as the server's group commit
        handles a lone message) instead of ``on_message``."""
        self.path, self.policy, self.now, self.batched = str(path), policy, t0, batched
        self.sent: list[tuple[bytes, P.Message]] = []
        self.start()

    def start(self) -> None:
        self.journal = Journal(self.path)
        with self.journal.transaction():
            epoch = self.journal.next_epoch()
        self.svc = SchedulerService(SchedulerCore(resolve(self.policy), random.Random(0)), self.journal, epoch,
                                       heartbeat_s=1.0, liveness=3)  # the tests' timelines count in 1 s beats
        self.svc.restore(self.now)

    def restart(self) -> None:
        self.journal.close()
        self.start()

    def advance(self, dt: float) -> list:
        self.now += dt
        out = self.svc.tick(self.now)
        self.sent += out
        return out

    def send(self, ident: bytes, msg: P.Message, dt: float = 0.0, peer: str | None = None) -> list:
        """``peer``: the sender's key name (the ZAP user id) as with CURVE; None as without keys."""
        self.now += dt
        # every message crosses the wire in production: encode/decode here too
        msg = P.decode(P.encode(msg))
        if self.batched:
            out = self.svc.on_batch([(ident, msg, peer)], self.now)
        else:
            out = self.svc.on_message(ident, msg, self.now, peer=peer)
        for _, m in out:
            P.decode(P.encode(m))
        self.sent += out
        return out

    def submit(self, workers=1, gpus=1, priority="guaranteed", **kw):
        env = kw.pop("env", {"PATH": "/usr/bin"})
        req = P.JobRequest(command=("python", "train.py"), cwd="/tmp", env=env, workers=workers, gpus=gpus,
                           priority=priority, **kw)
        return self.send(CLIENT, P.Submit(request=req))


class FakeNode:
    def __init__(self, h: Harness, node_id: str, gpus: int = 2, epoch: int = 1, host: str = "127.0.0.1",
                 models: tuple[str, ...] = ()):
        """``models``: each GPU's model, in index order (default: ``gpus`` GPUs of model ``sim``)."""
        self.h, self.node_id, self.ngpus, self.epoch, self.host = h, node_id, len(models) or gpus, epoch, host
        self.models = models
        self.ident = f"ident-{node_id}-{epoch}".encode()
        self.workers: dict[tuple[str, int], P.WorkerStatus] = {}

    def hello(self, status: bool = True) -> list:
        """Say hello and, as a real node does once welcomed, send a full status (``status=False``: not yet;
        the node joins the core with that first status)."""
        models = self.models or ("sim",) * self.ngpus
        gpus = tuple(P.NodeGpu(index=i, model=m, mem_total=16 * GiB) for i, m in enumerate(models))
        out = self.h.send(self.ident, P.NodeHello(node_id=self.node_id, epoch=self.epoch, host=self.host, gpus=gpus))
        welcomed = any(i == self.ident and isinstance(m, P.NodeWelcome) for i, m in out)
        return out + (self.status() if status and welcomed else [])

    def inbox(self, kind=None) -> list[P.Message]:
        return [m for ident, m in self.h.sent if ident == self.ident and (kind is None or isinstance(m, kind))]

    def start_all(self) -> list:
        """Start the workers of every StartPlacement received and not started yet."""
        out = []
        for m in self.inbox(P.StartPlacement):
            for w in m.workers:
                if (m.placement_id, w.rank) in self.workers:
                    continue
                self.workers[(m.placement_id, w.rank)] = P.WorkerStatus(job_id=m.job_id, placement_id=m.placement_id,
                                                                        rank=w.rank, pid=1000 + w.rank, running=True)
                out += self.h.send(self.ident, P.WorkerStarted(
                    node_id=self.node_id, epoch=self.epoch, job_id=m.job_id, placement_id=m.placement_id,
                    rank=w.rank, pid=1000 + w.rank, log_path=f"/logs/{m.job_id}/worker-{w.rank}.log"))
        return out

    def exit(self, placement_id: str, code: int = 0) -> list:
        out = []
        for (pid, rank), w in list(self.workers.items()):
            if pid == placement_id and w.running:
                self.workers[(pid, rank)] = P.WorkerStatus(job_id=w.job_id, placement_id=pid, rank=rank, pid=w.pid,
                                                           running=False, exit_code=code)
                out += self.h.send(self.ident, P.WorkerExited(node_id=self.node_id, epoch=self.epoch, job_id=w.job_id,
                                                              placement_id=pid, rank=rank, exit_code=code))
        return out

    def status(self, progress: tuple = ()) -> list:
        """A full status; ``progress``: the ``JobProgress`` summaries it carries."""
        gpus = tuple(P.GpuStatus(index=i, utilization=0.0, mem_used=0) for i in range(self.ngpus))
        return self.h.send(self.ident, P.NodeStatus(node_id=self.node_id, epoch=self.epoch, gpus=gpus,
                                                    workers=tuple(w for w in self.workers.values() if w.running),
                                                    progress=progress))

    def heartbeat(self, dt: float = 0.0) -> list:
        return self.h.send(self.ident, P.NodeHeartbeat(node_id=self.node_id, epoch=self.epoch), dt)


def one_running_job(h: Harness, n: FakeNode) -> tuple[P.Submitted, str]:
    """Node ``n`` says hello, a one-GPU job is submitted and its worker starts there: (the acknowledgement, the
    placement's id)."""
    n.hello()
    (ack,) = replies(h.submit(gpus=1), P.Submitted)
    n.start_all()
    return ack, n.inbox(P.StartPlacement)[0].placement_id


def replies(out, kind=None, ident=CLIENT):
    return [m for i, m in out if i == ident and (kind is None or isinstance(m, kind))]


def job_row(h: Harness, job_id: str) -> dict:
    return h.journal.job(job_id)
