"""Prometheus exporter of the node: per-GPU and per-job gauges and counters.

Names follow Prometheus conventions (``colocate_`` prefix, base units, 0-1
ratios, ``_total`` counters). Values are read from the node core at scrape
time under the server's lock, so a scrape never sees a half-applied event.

| metric | labels | meaning |
| --- | --- | --- |
| colocate_gpu_memory_total_bytes | gpu, kind | device memory |
| colocate_gpu_utilization_ratio | gpu | device busy fraction over the last 2 s |
| colocate_gpu_jobs | gpu, priority | jobs on the GPU: registered workers, and placed workers that have not registered (a job that never imports torch) |
| colocate_job_memory_cap_bytes | job, gpu, priority | current memory cap |
| colocate_job_memory_reserved_bytes | job, gpu, priority | reserved device bytes at the last boundary |
| colocate_job_memory_allocated_peak_bytes | job, gpu, priority | allocated peak in the last mini-batch |
| colocate_job_host_bytes | job, gpu, priority | bytes served from host memory in the last mini-batch (held at its end, or touched within it where more) |
| colocate_job_sm_share_ratio | job, gpu, priority | compute share 0..1 |
| colocate_job_busy_ratio | job, gpu, priority | measured device busy fraction (last 16 batches and the time since the last) |
| colocate_job_throughput_iterations_per_second | job, gpu, priority | mini-batches per second (last 16 and the time since the last: a paused job falls to 0) |
| colocate_job_iterations_total | job, gpu, priority | mini-batches reported |
| colocate_job_limit_updates_total | job, gpu, priority | limit updates sent (the limits seq) |
| colocate_node_messages_total | type | messages received |
| colocate_node_bad_messages_total | code | messages rejected (malformed, version, ...) |
| colocate_node_jobs_exited_total | | jobs that said goodbye (their process ended) |
| colocate_node_jobs_lost_total | | jobs whose process vanished or that fell silent |
| colocate_node_control_latency_seconds | | summary (count, sum): limit sent -> the job's acknowledgement received |
| colocate_node_control_latency_quantile_seconds | quantile | p50, p99 over the last 2000 updates |
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily

from colocate.base.vocab import JobClass
from colocate.node.state import host_served


class NodeCollector:
    def __init__(self, server):
        self.server = server

    def collect(self):
        srv = self.server
        with srv.lock:
            core, now = srv.core, srv.clock()
            gpu_mem = GaugeMetricFamily("colocate_gpu_memory_total_bytes", "Device memory", labels=["gpu", "kind"])
            gpu_util = GaugeMetricFamily("colocate_gpu_utilization_ratio", "Device busy fraction, last 2 s", labels=["gpu"])
            gpu_jobs = GaugeMetricFamily("colocate_gpu_jobs", "Jobs on the GPU", labels=["gpu", "priority"])
            on_gpu = _jobs_on_gpus(core)
            for g in core.gpus.values():
                i = str(g.spec.index)
                gpu_mem.add_metric([i, g.spec.kind], g.spec.mem_total)
                gpu_util.add_metric([i], g.utilization(now))
                for prio in (JobClass.GUARANTEED, JobClass.OPPORTUNISTIC):
                    gpu_jobs.add_metric([i, prio], on_gpu.get((g.spec.index, prio), 0))
            labels = ["job", "gpu", "priority"]
            fam: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
                "cap": GaugeMetricFamily("colocate_job_memory_cap_bytes", "Memory cap", labels=labels),
                "res": GaugeMetricFamily("colocate_job_memory_reserved_bytes", "Reserved device bytes", labels=labels),
                "peak": GaugeMetricFamily("colocate_job_memory_allocated_peak_bytes", "Allocated peak, last batch", labels=labels),
                "host": GaugeMetricFamily("colocate_job_host_bytes", "Bytes served from host memory", labels=labels),
                "share": GaugeMetricFamily("colocate_job_sm_share_ratio", "Compute share", labels=labels),
                "busy": GaugeMetricFamily("colocate_job_busy_ratio", "Measured device busy fraction", labels=labels),
                "tput": GaugeMetricFamily("colocate_job_throughput_iterations_per_second", "Mini-batches per second", labels=labels),
                "iters": CounterMetricFamily("colocate_job_iterations", "Mini-batches reported", labels=labels),
                "upd": CounterMetricFamily("colocate_job_limit_updates", "Limit updates sent", labels=labels),
            }
            for j in core.jobs.values():
                lv = [j.job_id, str(j.gpu), j.klass]
                last = j.last
                fam["cap"].add_metric(lv, j.limits.mem_cap)
                fam["res"].add_metric(lv, last.mem_reserved if last else 0)
                fam["peak"].add_metric(lv, last.mem_allocated_peak if last else 0)
                fam["host"].add_metric(lv, host_served(last))
                fam["share"].add_metric(lv, j.limits.sm_share)
                fam["busy"].add_metric(lv, j.busy_fraction(now=now))
                fam["tput"].add_metric(lv, j.throughput(now=now))
                fam["iters"].add_metric(lv, j.iterations)
                fam["upd"].add_metric(lv, j.limits.seq)
            msgs = CounterMetricFamily("colocate_node_messages", "Messages received", labels=["type"])
            for t, n in sorted(srv.counts.items()):
                msgs.add_metric([t], n)
            bad = CounterMetricFamily("colocate_node_bad_messages", "Messages rejected", labels=["code"])
            for c, n in sorted(srv.bad_counts.items()):
                bad.add_metric([c], n)
            exited = CounterMetricFamily("colocate_node_jobs_exited", "Jobs that said goodbye")
            exited.add_metric([], core.jobs_exited)
            lost = CounterMetricFamily("colocate_node_jobs_lost", "Jobs whose process vanished or fell silent")
            lost.add_metric([], core.jobs_lost)
            lat = sorted(core.control_latencies)
            summ = SummaryMetricFamily("colocate_node_control_latency_seconds",
                                       "Limit sent to the job's acknowledgement received (node clock)",
                                       count_value=core.control_count, sum_value=core.control_sum_s)
        yield from [gpu_mem, gpu_util, gpu_jobs, *fam.values(), msgs, bad, exited, lost, summ]
        if lat:
            q = GaugeMetricFamily("colocate_node_control_latency_quantile_seconds",
                                  "Control latency quantiles over the last 2000 updates", labels=["quantile"])
            for p in (0.5, 0.99):
                q.add_metric([str(p)], lat[min(len(lat) - 1, int(p * len(lat)))])
            yield q


def serve(server, port: int, addr: str = "127.0.0.1"):
    """Start the HTTP endpoint in a daemon thread; returns the registry."""
    registry = CollectorRegistry()
    registry.register(NodeCollector(server))
    start_http_server(port, addr=addr, registry=registry)
    return registry


def _jobs_on_gpus(core) -> dict[tuple[int, str], int]:
    """(GPU, priority) -> workers on it: each registered worker on its GPU, and each running placed worker that has
    not registered (a job that never imports torch never does) on each of its GPUs."""
    out: dict[tuple[int, str], int] = {}
    registered = set()
    for w in core.jobs.values():
        registered.add((w.job, w.rank or 0))
        out[(w.gpu, w.klass)] = out.get((w.gpu, w.klass), 0) + 1
    for p in core.table.placements.values():
        prio = JobClass.GUARANTEED if p.promoted else p.klass
        for w in p.workers:
            if w.running and (p.job_id, w.rank) not in registered:
                for g in w.gpus:
                    out[(g, prio)] = out.get((g, prio), 0) + 1
    return out
