"""Reading a command line without running it (pure).

``python_script(args)``: the script a ``python ARGS`` command runs, ``"-"`` for standard input, or None for
``-c``/``-m``/interactive. It is how a job's default name and its entry script are found.
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
