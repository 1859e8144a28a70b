"""Builds (once, then cached) and loads the simulated-GPU allocator extension.

The extension is compiled with ``torch.utils.cpp_extension.load`` the first time a
process needs it (about 30-40 s on 2 cores) and cached under
``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``); concurrent
builders wait on torch's own file lock. Only the sim device needs it.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

_SOURCE = Path(__file__).with_name("csrc") / "sim_allocator.cpp"
_lock = threading.Lock()
_module = None


def load(verbose: bool = False):
    """Return the compiled extension module, building it on first use."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        from torch.utils import cpp_extension

        if not verbose and sys.stderr.isatty() and not _is_cached():
            print("colocate: building the simulated-GPU allocator (first run only, ~40 s)...", file=sys.stderr)
        _module = cpp_extension.load(
            name="colocate_sim_allocator",
            sources=[str(_SOURCE)],
            extra_cflags=["-O2"],
            verbose=verbose,
        )
        return _module


def _is_cached() -> bool:
    try:
        from torch.utils.cpp_extension import _get_build_directory

        build = Path(_get_build_directory("colocate_sim_allocator", verbose=False))
        return any(build.glob("colocate_sim_allocator*.so"))
    except Exception:
        return False
