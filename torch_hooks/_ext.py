"""Builds (once, then cached) and loads the simulated-GPU allocator extension.

The extension is compiled with ``torch.utils.cpp_extension.load`` the first time a process needs
it (about 10-40 s on 2 cores) and cached under ``$TORCH_EXTENSIONS_DIR`` (default
``~/.cache/torch_extensions``); concurrent builders wait on torch's own file lock. Only the sim
device needs it.

Fast path: after a build, a stamp beside the library records what it was built from (a hash of the
source, the flags, torch's and Python's versions). A later process whose inputs hash the same imports
the cached library directly, without torch's freshness check (which runs ninja under a file lock
shared by every process on the machine: 0.15 s at best, seconds when other jobs start at once).
Any change of the inputs, or a missing library or stamp, takes the full path again.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
from pathlib import Path

NAME = "colocate_sim_allocator"
_SOURCE = Path(__file__).with_name("csrc") / "sim_allocator.cpp"
_CFLAGS = ["-O2"]
_lock = threading.Lock()
_module = None


def load(verbose: bool = False):
    """Return the compiled extension module, building it on first use."""
    global _module
    with _lock:
        if _module is not None:
            return _module
        key, build = _inputs_key(), build_directory()
        _module = _load_stamped(build, key)
        if _module is not None:
            return _module
        from torch.utils import cpp_extension  # 0.3 s to import (setuptools): only when building

        if not verbose and sys.stderr.isatty() and _library(build) is None:
            print("colocate: building the simulated-GPU allocator (first run only, ~40 s)...", file=sys.stderr)
        _module = cpp_extension.load(name=NAME, sources=[str(_SOURCE)], extra_cflags=_CFLAGS, verbose=verbose)
        _write_stamp(build, key)
        return _module


def build_directory() -> Path:
    """Where torch's ``cpp_extension`` builds this extension (its ``_get_build_directory`` rule,
    computed without importing that module; a test holds the two together)."""
    import torch

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        from torch._appdirs import user_cache_dir

        if torch.version.hip is not None:
            accel = f'rocm{torch.version.hip.replace(".", "")}'
        elif torch.version.cuda is not None:
            accel = f'cu{torch.version.cuda.replace(".", "")}'
        else:
            accel = "cpu"
        py = f'py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, "abiflags", "")}'
        root = os.path.join(os.path.realpath(user_cache_dir(appname="torch_extensions")), f"{py}_{accel}")
    return Path(root) / NAME


def _inputs_key() -> str:
    import torch

    h = hashlib.sha256()
    h.update(_SOURCE.read_bytes())
    h.update(repr((_CFLAGS, torch.__version__, sys.version, sys.platform)).encode())
    return h.hexdigest()


def _library(build: Path) -> Path | None:
    for suffix in importlib.machinery.EXTENSION_SUFFIXES + [".so"]:
        path = build / f"{NAME}{suffix}"
        if path.exists():
            return path
    return None


def _load_stamped(build: Path, key: str):
    """The cached library, imported directly when its stamp matches ``key``; else None."""
    stamp, lib = build / f"{NAME}.colocate-stamp", _library(build)
    try:
        if lib is None or stamp.read_text().strip() != key:
            return None
    except OSError:
        return None
    spec = importlib.util.spec_from_file_location(NAME, lib)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError:
        return None  # e.g. a library built against another torch: rebuild
    return module


def _write_stamp(build: Path, key: str) -> None:
    tmp = build / f"{NAME}.colocate-stamp.{os.getpid()}"
    try:
        tmp.write_text(key + "\n")
        os.replace(tmp, build / f"{NAME}.colocate-stamp")
    except OSError:
        pass  # no stamp: the next process takes the full path, nothing worse
