"""What every colocate daemon (node, scheduler) shares at its edge: start-up errors, logging, stopping.

``StartError(message, code)``: raised before serving; the command prints ``colocate NAME: message``
and exits ``code`` (2: bad options, config or keys; 1: could not start, e.g. an endpoint in use).
``configure_logging(name, level)``: one line per record, ``TIME colocate-NAME LEVEL message``.
``stop_on_signals(stop)``: SIGTERM and SIGINT call ``stop()`` (the daemon then exits 0).
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


def stop_on_signals(stop) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: stop())
