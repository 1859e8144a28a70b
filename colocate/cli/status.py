"""``colocate status [JOB] [--json]``: one job in detail, or every job the scheduler knows (sacct-like), with its
predicted run time (pending) or time left (running), and the history behind the prediction."""

from __future__ import annotations

import json
import time

from colocate.cli._common import JOB_ID, add_scheduler_options, client_failure, scheduler_client


def register(sub) -> None:
    p = sub.add_parser("status", help="show one job, or every job (finished ones too)",
                       description="The state of one job (pending/placing/running/succeeded/failed/cancelled, "
                       "why, where, attempts, exit code: the first failing worker's) or of every job. "
                       "Exit code: 0; 1 unknown job or no answer; 2 a bad job id or option.")
    p.add_argument("job", nargs="?", type=JOB_ID, metavar="JOB")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_scheduler_options(p)
    p.set_defaults(func=main)


def view_dict(v) -> dict:
    """A ``JobView`` (a record, not a message) as a JSON-ready dict: its fields, tuples as lists."""
    import dataclasses

    from colocate import protocol as P

    out = {k: (list(x) if isinstance(x, tuple) else x) for k, x in dataclasses.asdict(v).items()}
    for key in ("progress", "prediction"):
        if getattr(v, key, None) is not None:
            out[key] = P.record_map(getattr(v, key))
    return out


def progress_lines(p) -> list[tuple[str, str]]:
    """What ``colocate status JOB`` shows of a job's ``JobProgress`` (and its features, when there)."""
    from colocate.base.units import format_size

    total = p.total_iterations
    done = f"{p.iterations}" + (f" of {total} ({min(1.0, p.iterations / total):.0%})" if total else " (total unknown)")
    lines = [("iterations", done),
             ("step time", f"p50 {p.step_p50_s * 1e3:.1f} ms, p90 {p.step_p90_s * 1e3:.1f} ms"
                           + (f", mean {p.step_mean_s * 1e3:.1f} ms" if p.step_mean_s else "") + f" (last {p.window})"),
             ("peak memory", f"{format_size(p.mem_reserved_peak)} reserved, {format_size(p.mem_allocated_peak)} "
                             "allocated"),
             ("busy", f"{p.busy_fraction:.0%} of wall time (rank {p.rank}, reported {p.since_report_s:.0f} s ago)")]
    f = p.features
    if f is not None:
        m, hw = f.model, f.hardware
        amp = f", autocast {m.autocast_dtype}" if m.autocast_dtype else ""
        lines.append(("model", f"{m.params:,} parameters, {m.flops_per_iteration / 1e9:.3g} GFLOP/iteration, batch "
                               f"{m.batch_size if m.batch_size is not None else '?'}, "
                               f"{'+'.join(m.optimizers) or 'no optimizer'}, {m.param_dtype}{amp}"))
        lines.append(("layers", ", ".join(f"{k} x{n}" for k, n in sorted(m.layer_counts, key=lambda kv: -kv[1]))[:200]
                      or "-"))
        speed = f", simulated, speed {hw.sim_speed:g}" if hw.sim_speed else ""
        lines.append(("gpu", f"{hw.name or hw.kind} ({format_size(hw.mem_total)}, {hw.sm_count or '?'} SMs{speed}) "
                             f"x {hw.gpus}"))
    return lines


def main(args) -> int:
    from colocate.base.units import format_duration
    from colocate.cli._tables import prediction_cell, prediction_line, print_table
    from colocate.clients import rpc

    try:
        client = scheduler_client(args)
        jobs = [client.job(args.job)] if args.job else client.jobs()[0]
    except rpc.RpcError as exc:
        return client_failure("status", exc)
    if args.json:
        print(json.dumps([view_dict(j) for j in jobs] if not args.job else view_dict(jobs[0]), indent=2))
        return 0
    now = time.time()
    if args.job:
        j = jobs[0]
        ran = (j.ended_at or now) - j.started_at if j.started_at else None
        fields = [("job", j.job_id), ("name", j.name), ("user", j.user), ("queue", j.queue), ("class", j.priority),
                  ("state", j.state), ("workers", f"{j.workers} x {j.gpus} GPU(s)"),
                  ("submitted", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(j.submitted_at))),
                  ("waited", format_duration((j.started_at or now) - j.submitted_at)),
                  ("ran", format_duration(ran)), ("placement", j.placement_id or "-"),
                  ("nodes", ",".join(j.nodes) or "-"), ("attempts", str(j.attempts)),
                  ("exit code", "-" if j.exit_code is None else str(j.exit_code)), ("reason", j.reason or "-")]
        if j.advice:
            fields.append(("recommended", j.advice))
        if j.prediction is not None:
            fields.append(("predicted", prediction_line(j.prediction)))
        if j.progress is not None:
            fields += progress_lines(j.progress)
        width = max(len(k) for k, _ in fields)
        for k, v in fields:
            print(f"{k:>{width}}: {v}")
        return 0
    rows = [(j.job_id, j.name, j.user, j.queue, j.priority, j.state, str(j.workers), str(j.gpus),
             format_duration((j.started_at or now) - j.submitted_at),
             format_duration((j.ended_at or now) - j.started_at if j.started_at else None),
             "-" if j.exit_code is None else str(j.exit_code), prediction_cell(j.prediction, j.learning)) for j in jobs]
    print_table(("JOBID", "NAME", "USER", "QUEUE", "CLASS", "STATE", "WORKERS", "GPUS", "WAITED", "RAN", "EXIT",
                 "PREDICTED [LEVEL N]"), rows, right=("WORKERS", "GPUS", "WAITED", "RAN", "EXIT"))
    return 0
