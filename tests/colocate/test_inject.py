"""The injected ``sitecustomize`` chains the one it shadows exactly once, also when two copies of colocate's
injector are on PYTHONPATH (a checkout's and an installed package's: a Ray driver run in a checkout sends its
own beside the node's)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
INJECT = REPO / "colocate" / "_inject"


def test_two_injectors_and_a_user_sitecustomize_each_run_once(tmp_path):
    other = tmp_path / "installed" / "colocate" / "_inject"  # another colocate's copy of the injector
    shutil.copytree(INJECT, other)
    user = tmp_path / "user"
    user.mkdir()
    marks = tmp_path / "marks.txt"
    (user / "sitecustomize.py").write_text(f"open({str(marks)!r}, 'a').write('user\\n')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COLOCATE_", "PYTHON"))}
    for first, second in ((INJECT, other), (other, INJECT)):
        marks.unlink(missing_ok=True)
        env["PYTHONPATH"] = os.pathsep.join(map(str, (first, second, user)))
        res = subprocess.run([sys.executable, "-c", "print('ran')"], env=env, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 0 and res.stdout == "ran\n", res
        assert "Error in sitecustomize" not in res.stderr, res.stderr
        assert marks.read_text() == "user\n"  # the user's sitecustomize ran, once
