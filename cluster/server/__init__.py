"""The live global scheduler: ``colocate scheduler --bind ... --state PATH.db [--config policy.toml]``.

``journal`` (SQLite, write-ahead), ``service`` (messages -> journal -> core -> messages, no sockets),
``server`` (the ZeroMQ ROUTER edge), ``launch`` (placements -> node messages, rendezvous ports),
``views`` (what clients see), ``metrics`` (Prometheus), ``daemon`` (assembling and running it).
"""
