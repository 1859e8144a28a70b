"""Prometheus exporter of the scheduler, read from the service at scrape time under the server's lock.

| metric | labels | meaning |
| --- | --- | --- |
| colocate_scheduler_queue_jobs | queue | pending jobs per queue |
| colocate_scheduler_jobs | state | jobs the core holds, by state |
| colocate_scheduler_gpus | state | GPUs: total, allocated (a guaranteed worker), shared (an opportunistic worker) |
| colocate_scheduler_nodes | state | nodes up / down |
| colocate_scheduler_node_up | node | 1 while the node is up |
| colocate_scheduler_decisions_total | type | decisions made (JobChanged, StartWorkers, StopWorkers, Promote) |
| colocate_scheduler_preemptions_total | | opportunistic placements stopped for guaranteed jobs |
| colocate_scheduler_messages_total | type | messages received |
| colocate_scheduler_bad_messages_total | code | errors replied (malformed, version, unknown_node, ...) |
| colocate_scheduler_decision_latency_seconds | | summary: a message in -> its decisions journaled and sent |
| colocate_scheduler_decision_latency_quantile_seconds | quantile | p50, p99 over the last 5000 |
| colocate_scheduler_journal_writable | | 1 while the journal takes writes; 0 while submits and cancels are refused |
| colocate_scheduler_faults_total | cause | policy core rebuilt from the journal: core (an exception), journal (a write failed) |
| colocate_scheduler_oom_restarts_total | | runs out of GPU memory under a recommended cap, restarted at their fallback (journaled) |
| colocate_scheduler_reclaims_total | | opportunistic runs a node stopped to give their GPU memory back to a guaranteed job, queued again (since the scheduler started) |
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from colocate.base.vocab import JobClass, JobState

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric

    from cluster.server.server import SchedulerServer

STATES = tuple(JobState)


class SchedulerCollector:
    def __init__(self, server: SchedulerServer):
        self.server = server
        self.queues_seen: set[str] = {"default"}  # a queue once seen reads 0 when empty, not absent

    def collect(self) -> Iterator[Metric]:
        srv = self.server
        with srv.lock:
            svc = srv.service
            core = svc.core
            queue = GaugeMetricFamily("colocate_scheduler_queue_jobs", "Pending jobs per queue", labels=["queue"])
            pending = core.queues()
            self.queues_seen.update(pending)
            for q in sorted(self.queues_seen):
                queue.add_metric([q], len(pending.get(q, ())))
            states = Counter(j.state for j in core.jobs.values())
            jobs = GaugeMetricFamily("colocate_scheduler_jobs", "Jobs by state", labels=["state"])
            for st in STATES:
                jobs.add_metric([st], states.get(st, 0))
            nodes = core.nodes()
            gpus = GaugeMetricFamily("colocate_scheduler_gpus", "GPUs by state", labels=["state"])
            gpus.add_metric(["total"], sum(len(n["gpus"]) for n in nodes if n["up"]))
            gpus.add_metric(["allocated"], sum(1 for n in nodes if n["up"] for g in n["gpus"] if g[JobClass.GUARANTEED]))
            gpus.add_metric(["shared"], sum(1 for n in nodes if n["up"] for g in n["gpus"] if g[JobClass.OPPORTUNISTIC]))
            up = GaugeMetricFamily("colocate_scheduler_node_up", "1 while the node is up", labels=["node"])
            count = GaugeMetricFamily("colocate_scheduler_nodes", "Nodes by state", labels=["state"])
            for n in nodes:
                up.add_metric([n["node_id"]], 1.0 if n["up"] else 0.0)
            count.add_metric(["up"], sum(1 for n in nodes if n["up"]))
            count.add_metric(["down"], sum(1 for n in nodes if not n["up"]))
            decisions = CounterMetricFamily("colocate_scheduler_decisions", "Decisions made", labels=["type"])
            for t, k in sorted(svc.decided.items()):
                decisions.add_metric([t], k)
            pre = CounterMetricFamily("colocate_scheduler_preemptions", "Opportunistic placements preempted")
            pre.add_metric([], core.counters()["preemptions"])
            msgs = CounterMetricFamily("colocate_scheduler_messages", "Messages received", labels=["type"])
            for t, k in sorted(svc.counts.items()):
                msgs.add_metric([t], k)
            bad = CounterMetricFamily("colocate_scheduler_bad_messages", "Errors replied", labels=["code"])
            for c, k in sorted(svc.bad.items()):
                bad.add_metric([c], k)
            lat = sorted(svc.latency)
            summ = SummaryMetricFamily("colocate_scheduler_decision_latency_seconds",
                                       "A message in to its decisions journaled and sent",
                                       count_value=svc.latency_count, sum_value=svc.latency_sum)
            writable = GaugeMetricFamily("colocate_scheduler_journal_writable", "1 while the journal takes writes")
            writable.add_metric([], 0.0 if svc.unavailable is not None else 1.0)
            faults = CounterMetricFamily("colocate_scheduler_faults", "Core rebuilds by cause", labels=["cause"])
            for c in ("core", "journal"):
                faults.add_metric([c], svc.faults.get(c, 0))
            ooms = CounterMetricFamily("colocate_scheduler_oom_restarts",
                                       "Runs out of GPU memory under a recommended cap, restarted at their fallback")
            ooms.add_metric([], svc.journal.oom_restarts())
            reclaims = CounterMetricFamily("colocate_scheduler_reclaims", "Opportunistic runs stopped by their node "
                                           "for a guaranteed job's memory, queued again")
            reclaims.add_metric([], core.counters()["reclaims"])
        yield from [queue, jobs, gpus, count, up, decisions, pre, msgs, bad, summ, writable, faults, ooms, reclaims]
        if lat:
            quantiles = GaugeMetricFamily("colocate_scheduler_decision_latency_quantile_seconds",
                                          "Decision latency quantiles over the last 5000 decisions", labels=["quantile"])
            for p in (0.5, 0.99):
                quantiles.add_metric([str(p)], lat[min(len(lat) - 1, int(p * len(lat)))])
            yield quantiles


def serve(server: SchedulerServer, port: int, addr: str = "127.0.0.1") -> CollectorRegistry:
    """Start the HTTP endpoint in a daemon thread; returns the registry."""
    registry = CollectorRegistry()
    registry.register(SchedulerCollector(server))
    start_http_server(port, addr=addr, registry=registry)
    return registry
