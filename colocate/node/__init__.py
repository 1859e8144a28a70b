"""The node coordinator: one daemon per machine that owns its GPUs.

``core`` is the pure state machine (``NodeCore.handle(event, now) -> commands``),
``policies`` the plug-in policies it runs (exclusive, pack, static, adaptive),
``server`` the ZeroMQ edge, ``metrics`` the Prometheus exporter.
"""
