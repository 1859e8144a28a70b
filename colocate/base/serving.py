"""What every colocate daemon (node, scheduler) shares at its edge: start-up errors, logging, stopping.

``StartError(message, code)``: raised before serving; the command prints ``colocate NAME: message``
and exits ``code`` (2: bad options, config or keys; 1: could not start, e.g. an endpoint in use).
``configure_logging(name, level)``: one line per record, ``TIME colocate-NAME LEVEL message``.
``serve_metrics(serve, server, port)``: the Prometheus endpoint, or ``StartError`` (code 1).
``stop_on_signals(stop)``: SIGTERM and SIGINT call ``stop()`` (the daemon then exits 0).
``LogLimit(per_s)``: ``allow(now)`` is True for at most ``per_s`` calls a second (a flood of bad input
logs that many lines a second, not one per message).
"""

from __future__ import annotations

import logging
import signal


class StartError(Exception):
    def __init__(self, message: str, code: int):
        super().__init__(message)
        self.code = code


def configure_logging(name: str, level: str) -> None:
    logging.basicConfig(level=level.upper(), format=f"%(asctime)s colocate-{name} %(levelname)s %(message)s")


class LogLimit:
    def __init__(self, per_s: int):
        self.per_s = per_s
        self._window = (0.0, 0)  # (start, calls in the window)

    def allow(self, now: float) -> bool:
        start, n = self._window
        if now - start > 1.0:
            start, n = now, 0
        self._window = (start, n + 1)
        return n < self.per_s


def serve_metrics(serve, server, port: int) -> None:
    """``serve(server, port)`` (a Prometheus endpoint); on failure close ``server`` and raise ``StartError``."""
    try:
        serve(server, port)
    except OSError as exc:
        server.close()
        raise StartError(f"cannot serve metrics on port {port}: {exc.strerror}", 1) from None


def stop_on_signals(stop) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: stop())
