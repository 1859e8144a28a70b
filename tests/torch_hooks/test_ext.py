"""torch_hooks/_ext.py: the fast path that imports the cached allocator library directly."""

from __future__ import annotations


def test_fast_path_imports_the_stamped_library_and_only_it(run_py_json, sim_ext):
    out = run_py_json(r'''
import sys
from pathlib import Path
import torch
from torch_hooks import _ext
build = _ext.build_directory()
key = _ext._inputs_key()
m = _ext.load()
fast = "torch.utils.cpp_extension" not in sys.modules  # the stamp matched: no freshness check, no setuptools
ok = _ext._load_stamped(build, key) is not None
stale = _ext._load_stamped(build, "0" * 64)  # inputs changed (another source, torch, flags): full path
from torch.utils import cpp_extension
same_rule = Path(cpp_extension._get_build_directory(_ext.NAME, verbose=False)) == build
emit({"fast": fast, "ok": ok, "stale": stale is None, "same_rule": same_rule, "has_install": hasattr(m, "install")})
''')
    assert out == {"fast": True, "ok": True, "stale": True, "same_rule": True, "has_install": True}
