"""Small file helpers shared by daemons and the job runtime."""

from __future__ import annotations

import json
import os


def write_json_atomic(path: str, obj, mode: int | None = None, compact: bool = False) -> None:
    """Write ``obj`` as JSON so readers never see a partial file (rename is atomic). ``mode``: the file's
    permission bits whatever the process umask (None: as the umask makes them). ``compact``: one line, no
    spaces (for a file rewritten often); else indented, keys sorted (for a file people read)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        if mode is not None:
            os.fchmod(f.fileno(), mode)
        if compact:
            f.write(json.dumps(obj, separators=(",", ":")))
        else:
            json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
