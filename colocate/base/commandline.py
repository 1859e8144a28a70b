"""Reading a command line without running it (pure).

``python_script(args)``: the script a ``python ARGS`` command runs, ``"-"`` for standard input, or None for
``-c``/``-m``/interactive. It is how a job's default name and its entry script are found.
``entry_point(command)``: what any command line runs (a script, a module, code, a program) and its arguments:
what a job's fingerprint is made of.
"""

from __future__ import annotations


def python_script(args) -> str | None:
    """The script argument of a python command line, or None for -c/-m/interactive.

    Short flags may be combined (``-uc``, ``-Bm``); ``-W``/``-X`` take a value,
    attached or in the next argument."""
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args[i + 1] if i + 1 < len(args) else None
        if arg == "--check-hash-based-pycs":
            i += 2
            continue
        if arg.startswith("--") or arg == "-":
            if arg == "-":
                return arg
            i += 1
            continue
        if arg.startswith("-"):
            letters = arg[1:]
            for k, ch in enumerate(letters):
                if ch in "cm":
                    return None
                if ch in "WX":
                    if k == len(letters) - 1:
                        i += 1  # the value is the next argument
                    break
            i += 1
            continue
        return arg
    return None


def entry_point(command) -> tuple[str, str, tuple[str, ...]]:
    """``(kind, target, args)``: what a job's command line runs, for its fingerprint (pure; nothing is read).

    ``kind`` is ``script`` (``python [OPTIONS] X.py ARGS``, or a program given as a path such as ``./train.sh``:
    ``target`` is that path, which the caller may read and hash), ``module`` (``python -m pkg ARGS``: ``target`` is
    the module), ``code`` (``python -c CODE ARGS``: ``target`` is the code), ``stdin`` (``python -``) or ``program``
    (a program found on PATH, e.g. ``torchrun``: ``target`` is its name). ``args`` are the arguments after it."""
    command = [str(c) for c in command]
    if not command:
        return "program", "", ()
    prog, rest = command[0], command[1:]
    if not prog.rsplit("/", 1)[-1].startswith("python"):
        return ("script" if "/" in prog else "program"), prog, tuple(rest)
    i = 0
    while i < len(rest):
        arg = rest[i]
        if arg == "--":
            return ("script", rest[i + 1], tuple(rest[i + 2:])) if i + 1 < len(rest) else ("stdin", "-", ())
        if arg == "-":
            return "stdin", "-", tuple(rest[i + 1:])
        if arg == "--check-hash-based-pycs":
            i += 2
            continue
        if arg.startswith("--"):
            i += 1
            continue
        if arg.startswith("-"):
            letters = arg[1:]
            for k, ch in enumerate(letters):
                if ch in "cm":
                    kind = "code" if ch == "c" else "module"
                    value = letters[k + 1:]
                    if value:
                        return kind, value, tuple(rest[i + 1:])
                    return kind, rest[i + 1] if i + 1 < len(rest) else "", tuple(rest[i + 2:])
                if ch in "WX":
                    if k == len(letters) - 1:
                        i += 1
                    break
            i += 1
            continue
        return "script", arg, tuple(rest[i + 1:])
    return "program", prog, ()
