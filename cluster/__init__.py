"""The global scheduler: a pure policy core and its edges.

``cluster.core.SchedulerCore.handle(event, now) -> decisions`` is the core (events and decisions:
``cluster.events``); the policies are plugins (``cluster.plugins``) at the framework's extension points
(``cluster.points``, run by ``cluster.framework``), chosen by the policy config (``cluster.config``). The
live edge is ``cluster.server`` (ZeroMQ, SQLite journal), the trace-driven one ``cluster.sim``, fed by
``cluster.traces``; ``colocate.clients.scheduler`` speaks to a live scheduler. docs/scheduler.md and docs/simulator.md
describe them; pyproject.toml's ``cluster-layers`` contract keeps their order.
"""
