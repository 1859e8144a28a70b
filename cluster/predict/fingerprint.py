"""A job's fingerprints: what identifies "the same job again" (exact) and "the same experiment
with other hyperparameters" (family), from the user, the entry script's content hash (computed by
the caller, which can read the file) and the command-line arguments.

Normalisation (``normalise_args``), in order:
  * ``--flag=value`` is split into ``--flag value``; a flag's value is the next token unless that
    token is itself a flag (``-x``/``--x``, but not a negative number);
  * a flag whose name (dashes and underscores equal, case ignored) names a seed, an output or
    log location, or a run name (``SEED_WORDS``, ``OUTPUT_FLAGS``) is dropped with its value;
  * in every remaining token a timestamp (``2026-11-25``, ``20261125-0349``, ``2026-11-25T03:49:51``)
    becomes ``<ts>``;
  * flags are sorted by name (their order does not change the job); positionals keep their order.
For the family, every number (an integer, a decimal, ``1e-3``) in a value becomes ``<num>``, so a
sweep over learning rates or batch sizes is one family.

Fingerprints are 16 hex digits of SHA-256 over the user, the script hash and the normalised
arguments: equal inputs give equal fingerprints on every machine (no salt, no clock).

``command_fingerprints(user, command, script_hash)`` fingerprints a whole command line: its entry point
(``colocate.base.commandline.entry_point``) names what stands for the script (its content hash, computed by
whoever can read the file; else ``module:NAME`` for ``python -m``, ``code:HASH`` for ``python -c``, ``path:X``
for a script nobody hashed, ``program:NAME`` for a program on PATH) and the arguments after it. The scheduler
calls it with the user of the submitter's key, so one user's jobs never fall under another's fingerprints."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

from colocate.base.commandline import entry_point

SEED_WORDS = ("seed",)
OUTPUT_FLAGS = frozenset((
    "output", "output-dir", "out", "out-dir", "outdir", "output-path", "save", "save-dir", "save-path", "savedir",
    "checkpoint", "checkpoint-dir", "ckpt", "ckpt-dir", "log", "log-dir", "logdir", "log-file", "logging-dir",
    "tensorboard-dir", "tb-dir", "run-name", "run-id", "exp-name", "experiment-name", "name", "wandb-name",
    "results-dir", "work-dir",
))
_TS = re.compile(r"(?<!\d)(?:19|20)\d{2}-?[01]\d-?[0-3]\d(?:[T_ -]?[0-2]\d:?[0-5]\d(?::?[0-5]\d)?)?(?!\d)")
_NUM = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")
_NEG = re.compile(r"-(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _flag_name(token: str) -> str:
    return token.lstrip("-").lower().replace("_", "-")


def _is_flag(token: str) -> bool:
    return token.startswith("-") and len(token) > 1 and not _NEG.fullmatch(token)


def _dropped(name: str) -> bool:
    return any(w in name for w in SEED_WORDS) or name in OUTPUT_FLAGS


def normalise_args(argv: Sequence[str], *, family: bool = False) -> tuple[str, ...]:
    """The arguments as the fingerprint sees them (module docstring); ``family`` also masks numbers."""
    flags: list[tuple[str, str | None]] = []
    positionals: list[str] = []
    toks = list(argv)
    i = 0
    while i < len(toks):
        tok = toks[i]
        i += 1
        if not _is_flag(tok):
            positionals.append(tok)
            continue
        value: str | None = None
        if "=" in tok:
            tok, value = tok.split("=", 1)
        elif i < len(toks) and not _is_flag(toks[i]):
            value = toks[i]
            i += 1
        name = _flag_name(tok)
        if not _dropped(name):
            flags.append((name, value))

    def clean(text: str) -> str:
        text = _TS.sub("<ts>", text)
        return _NUM.sub("<num>", text) if family else text

    out = [clean(p) for p in positionals]
    for name, value in sorted(flags, key=lambda f: (f[0], f[1] or "")):
        out.append(f"--{name}" if value is None else f"--{name}={clean(value)}")
    return tuple(out)


def _digest(user: str, script_hash: str, args: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for part in (user, script_hash, *args):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def fingerprints(user: str, script_hash: str, argv: Sequence[str]) -> tuple[str, str]:
    """(exact, family) fingerprints of a job of ``user`` running a script whose content hashes to
    ``script_hash`` with arguments ``argv``."""
    return (_digest(user, script_hash, normalise_args(argv)),
            _digest(user, script_hash, normalise_args(argv, family=True)))


def script_hash(content: bytes) -> str:
    """The content hash of an entry script, as ``fingerprints`` expects it (the caller reads the file)."""
    return hashlib.sha256(content).hexdigest()


def script_identity(command: Sequence[str], script_hash: str = "") -> tuple[str, tuple[str, ...], str]:
    """``(identity, args, how)`` of a command line: what stands for its script in the fingerprint, the
    arguments after the entry point, and how the identity was found (``content``, ``module``, ``code``,
    ``path``: a script whose content was not hashed, ``program``). ``script_hash`` is the entry script's
    content hash (``script_hash()``), "" when the caller could not read it."""
    kind, target, args = entry_point(command)
    if kind == "script" and script_hash:
        return script_hash, args, "content"
    if kind == "script":
        return f"path:{target}", args, "path"
    if kind == "code":
        return "code:" + hashlib.sha256(target.encode()).hexdigest(), args, "code"
    if kind == "module":
        return f"module:{target}", args, "module"
    return f"{kind}:{target}", args, "program" if kind == "program" else kind


def numbers(argv: Sequence[str]) -> tuple[float, ...]:
    """The numbers the family fingerprint masks, in the order of the normalised arguments: what tells the runs of
    one family apart (a sweep's batch sizes, widths, learning rates)."""
    out: list[float] = []
    for tok in normalise_args(argv):
        for m in _NUM.finditer(_TS.sub("<ts>", tok.split("=", 1)[-1] if tok.startswith("--") else tok)):
            try:
                out.append(float(m.group()))
            except ValueError:  # a number too large to be a float
                out.append(float("inf"))
    return tuple(out)


def command_numbers(command: Sequence[str]) -> tuple[float, ...]:
    """``numbers`` of the arguments after a command line's entry point."""
    return numbers(entry_point(command)[2])


def command_fingerprints(user: str, command: Sequence[str], script_hash: str = "") -> tuple[str, str, str]:
    """(exact, family, how) of ``user`` running ``command`` (module docstring; ``how`` as ``script_identity``)."""
    identity, args, how = script_identity(command, script_hash)
    exact, family = fingerprints(user, identity, args)
    return exact, family, how
