"""Reading a policy config at the edge: a TOML file by path, or a preset by name. The only I/O of the
config; the schema and its checks are ``cluster.config`` (pure, inside the policy core's contract).
Every error is a ``ValueError`` with one line naming the file and what is wrong."""

from __future__ import annotations

import tomllib
from pathlib import Path

from cluster.config import PRESETS, PolicyConfig, parse_config, preset


def load_config(path: str | Path) -> PolicyConfig:
    """Read and validate a TOML policy file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")  # TOML is UTF-8, whatever the locale says
    except OSError as e:
        raise ValueError(f"{p}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{p}: not a UTF-8 text file ({e.reason} at byte {e.start})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        hint = " (plugin parameters go in [plugin.NAME] tables)" if "plugins" in str(e) else ""
        raise ValueError(f"{p}: not valid TOML: {e}{hint}") from None
    try:
        return parse_config(raw, str(p))
    except ValueError as e:  # the schema's line names the key; this one names the file too
        msg = str(e)
        raise ValueError(msg if msg.startswith(f"{p}: ") else f"{p}: {msg}") from None


def resolve(name_or_path: str) -> PolicyConfig:
    """A preset by name, else a TOML file by path."""
    if name_or_path in PRESETS:
        return preset(name_or_path)
    if not Path(name_or_path).exists():
        raise ValueError(f"unknown policy {name_or_path!r}: neither a preset ({', '.join(PRESETS)}) nor a file")
    return load_config(name_or_path)
