"""Showing a value that came from outside (a user's argument, a file's cell, a peer's message) in one line of an
error or a log: line breaks and control characters escaped, long values cut, so that one bad value can neither
split a line nor fill a terminal."""

from __future__ import annotations

import re

QUOTED_CHARS = 64  # of a value in an error message
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # C0, DEL, C1 and the Unicode line breaks


def quoted(text: str, limit: int = QUOTED_CHARS) -> str:
    """``text`` as ``repr`` shows it (quotes, escapes for line breaks and unprintable characters), cut to ``limit``
    characters, with the whole length said after a cut: ``'aaaa'... (100,000 characters)``."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text):,} characters)"


def shown(text: str, limit: int) -> str:
    """``text`` fit for one log line: each control character as its escape (``\\n``, ``\\x1b``), at most ``limit`` of
    its characters (then ``...``)."""
    cut = _UNSAFE.sub(lambda m: repr(m.group())[1:-1], text[:limit])
    return cut + "..." if len(text) > limit else cut
