"""The node coordinator: one daemon per machine that owns its GPUs.

``core`` is the one pure state machine for jobs and placements (``NodeCore.handle(event, now) -> commands``;
``placements`` its placement rules, ``events`` and ``commands`` what goes in and out),
``policies`` the plug-in policies it runs (exclusive, pack, static, adaptive),
``server`` the ZeroMQ edge, ``metrics`` the Prometheus exporter; with a scheduler,
``agent`` is the link to it (in the server's loop) and ``workers`` the worker manager that
starts, stops and re-adopts placements' processes (``worker_table`` its persisted table;
``gpustatus`` the GPUs' state for ``NodeStatus``). ``docs/node-placements.md`` is the contract.
"""
