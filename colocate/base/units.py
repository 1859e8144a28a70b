"""Parsing and formatting of byte sizes and fractions used on the command line.

Sizes accept binary (KiB, MiB, GiB, TiB) and decimal (KB, MB, GB, TB) suffixes,
a bare ``B``, or no suffix (bytes). Fractional values are allowed (``1.5GiB``) and
the result is rounded down to whole bytes.
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    # Kubernetes-style short forms
    "ki": 1 << 10,
    "mi": 1 << 20,
    "gi": 1 << 30,
    "ti": 1 << 40,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
    "t": 10**12,
}

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([A-Za-z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Return the number of bytes ``text`` names; raise ValueError with a clear message."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must not be negative: {text}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"not a size: {text!r}")
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(
            f"malformed size {text!r}: expected a number with an optional unit "
            "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 2GiB or 512MiB"
        )
    number, unit = m.group(1), m.group(2).lower()
    if unit not in _UNITS:
        raise ValueError(
            f"unknown size unit {m.group(2)!r} in {text!r}: use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"
        )
    return int(float(number) * _UNITS[unit])


def format_size(n: int | float | None) -> str:
    """Human-readable binary size: ``format_size(3 << 20) == '3.0 MiB'``."""
    if n is None:
        return "-"
    n = float(n)
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{sign}{n:.0f} {unit}" if unit == "B" else f"{sign}{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def parse_fraction(text: str | float, name: str = "value") -> float:
    """Parse a number in [0, 1]; raise ValueError naming ``name`` otherwise."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number between 0 and 1, got {text!r}") from None
    if not (0.0 <= value <= 1.0):  # also rejects NaN
        raise ValueError(f"{name} must be between 0 and 1, got {text!r}")
    return value


LONGEST_S = 100 * 365.25 * 86400  # 3,155,760,000: the longest time or duration (s) a report or a trace row may state


_DURATION_RE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*(d|h|m|min|s|sec)?", re.I)
_DURATION_UNITS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "min": 60.0, "s": 1.0, "sec": 1.0, None: 1.0}


def parse_duration(text: str | int | float) -> float:
    """Seconds that ``text`` names: ``90``, ``90s``, ``45m``, ``2h``, ``1h30m``, ``1d``, ``1:30:00``
    (h:m:s) or ``30:00`` (m:s). Raise ValueError with a clear message; the result is > 0."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        value = float(text)
    elif isinstance(text, str) and ":" in text:
        fields = text.strip().split(":")
        if not 2 <= len(fields) <= 3 or not all(p.strip().isdigit() for p in fields):
            raise ValueError(f"malformed duration {text!r}: expected h:mm:ss or mm:ss")
        value = 0.0
        for p in fields:
            value = value * 60 + int(p)
    elif isinstance(text, str):
        t = text.strip().replace(" ", "")
        pos, value, parts, bare = 0, 0.0, 0, False
        for m in _DURATION_RE.finditer(t):
            if m.start() != pos:
                break
            value += float(m.group(1)) * _DURATION_UNITS[(m.group(2) or "").lower() or None]
            pos, parts, bare = m.end(), parts + 1, bare or m.group(2) is None
        if not t or pos != len(t) or (parts > 1 and bare):  # "1h30": 30 what? a unit on every part
            raise ValueError(f"malformed duration {text!r}: expected e.g. 90, 90s, 45m, 2h, 1h30m, 1d or 1:30:00")
    else:
        raise ValueError(f"not a duration: {text!r}")
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"duration must be positive, got {text!r}")
    return value


def format_duration(seconds: float | None) -> str:
    """Slurm-style elapsed time: ``0:05``, ``12:34``, ``1:02:03``, ``2-01:00:00``; ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    days, s = divmod(s, 86400)
    hours, s = divmod(s, 3600)
    minutes, s = divmod(s, 60)
    if days:
        return f"{days}-{hours:02d}:{minutes:02d}:{s:02d}"
    if hours:
        return f"{hours}:{minutes:02d}:{s:02d}"
    return f"{minutes}:{s:02d}"
