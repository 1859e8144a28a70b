"""Injected by ``colocate run`` through PYTHONPATH into every Python process of a job.

1. Runs the ``sitecustomize`` this one shadows, if any (searched on the
   sys.path entries listed in COLOCATE_CHAIN_SITECUSTOMIZE, else the rest of
   sys.path), so an existing site setup keeps working.
2. When COLOCATE_ENABLED=1, arranges for ``torch_hooks.install()`` to run right
   after ``import torch`` completes. Processes that never import torch pay
   nothing; torchrun's agent process is skipped (its workers are the job).
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _is_injector(path: str) -> bool:
    """This directory, or another colocate's copy of it (a checkout's and an installed package's can both be on
    PYTHONPATH, as with a Ray driver run in a checkout): never chained, or each copy would run the other forever."""
    path = os.path.abspath(path)
    return path == _HERE or (os.path.basename(path) == "_inject" and os.path.basename(os.path.dirname(path)) == "colocate")


def _chain_previous() -> None:
    listed = os.environ.get("COLOCATE_CHAIN_SITECUSTOMIZE")
    paths = listed.split(os.pathsep) if listed else sys.path
    paths = [p for p in paths if p and not _is_injector(p)]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", paths)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_colocate_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


def _is_torchrun_agent() -> bool:
    argv0 = sys.argv[0] if sys.argv else ""
    return os.path.basename(argv0) == "torchrun" or argv0.replace(os.sep, "/").endswith("torch/distributed/run.py")


def _install_now() -> None:
    if _is_torchrun_agent():
        return
    try:
        import torch_hooks

        torch_hooks.install()
    except ValueError as exc:  # a bad COLOCATE_* value
        print(f"colocate: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as exc:
        print(f"colocate: the job runtime failed to start: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


class _TorchImportHook(importlib.abc.MetaPathFinder):
    """Wraps torch's loader so the runtime installs once torch is imported."""

    def find_spec(self, fullname, path, target=None):
        if fullname != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec("torch")
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _install_now()

        loader.exec_module = exec_module  # type: ignore[method-assign]  # the import hook: run after the module
        return spec


try:
    _chain_previous()
finally:
    if os.environ.get("COLOCATE_ENABLED") == "1":
        if "torch" in sys.modules:
            _install_now()
        else:
            sys.meta_path.insert(0, _TorchImportHook())
