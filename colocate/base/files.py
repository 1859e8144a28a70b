"""Small file helpers shared by daemons and the job runtime."""

from __future__ import annotations

import errno
import json
import os
import stat
import sys

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2  # renameat2(2): swap the two names atomically; both must exist
_exchange_fn: object = None  # renameat2 once looked up; False: not on this system
_TMP = ".tmp."  # write_json_atomic's temporary of PATH is PATH + _TMP + its writer's pid


def replace_file(src: str, dst: str) -> None:
    """Put ``src`` at ``dst`` atomically, as ``os.replace`` does: a reader of ``dst`` sees the old file or the
    new one, never a part of either, and a process killed at any point leaves one of the two there.

    Where ``dst`` exists and the system has it (Linux's ``renameat2``), the two names are *exchanged* and the
    old file, now at ``src``, is removed. That skips what a rename over an existing file costs on ext4
    (``auto_da_alloc``: it starts writing the new file out, and waits whenever the disk is busy: up to
    hundreds of ms for a 2 KB file on a shared disk). Neither way is made durable against power loss (no
    fsync; a daemon's tables are fenced by leases for that); a crash between the exchange and the removal
    leaves the old content at ``src`` (a temporary name). Raises OSError as ``os.replace``."""
    fn = _exchange()
    if fn and _is_file(dst):  # a directory (or nothing) there: os.replace says what is wrong, or renames
        if fn(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_EXCHANGE) == 0:
            try:
                os.unlink(src)
            except FileNotFoundError:
                pass
            return
        import ctypes

        if ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # no exchange here: not again
            global _exchange_fn
            _exchange_fn = False
        # ENOENT (no dst yet) and every other error: os.replace says what is wrong, or does it
    os.replace(src, dst)


def _is_file(path: str) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _exchange():
    global _exchange_fn
    if _exchange_fn is None:
        _exchange_fn = False
        if sys.platform.startswith("linux"):
            import ctypes

            try:
                fn = ctypes.CDLL(None, use_errno=True).renameat2
            except (OSError, AttributeError):  # a libc before 2.28, or none found
                return False
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
            _exchange_fn = fn
    return _exchange_fn


def write_json_atomic(path: str, obj, mode: int | None = None, compact: bool = False) -> None:
    """Write ``obj`` as JSON so readers never see a partial file (``write_text_atomic``). ``mode``: the file's
    permission bits whatever the process umask (None: as the umask makes them). ``compact``: one line, no
    spaces (for a file rewritten often); else indented, keys sorted (for a file people read)."""
    text = json.dumps(obj, separators=(",", ":")) if compact else json.dumps(obj, indent=2, sort_keys=True)
    write_text_atomic(path, text + "\n", mode)


def write_text_atomic(path: str, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` through a temporary beside it (``PATH.tmp.PID``, removed if the write fails)
    and ``replace_file``, so readers never see a partial file; ``mode`` as ``write_json_atomic``'s. A process
    killed before the replace leaves its temporary: ``remove_temporaries`` is for whoever owns the folder next."""
    tmp = f"{path}{_TMP}{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            if mode is not None:
                os.fchmod(f.fileno(), mode)
            f.write(text)
        replace_file(tmp, path)
    except BaseException:  # a full disk: no temporary left behind
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove_temporaries(path: str) -> list[str]:
    """Remove what ``write_text_atomic(path)`` (or ``write_json_atomic``) left when its process died before replacing (``PATH.tmp.PID``;
    after an exchange, the old content). Only names of that form go, and never a directory; a link is removed,
    not followed. For a caller that keeps every other writer of ``path`` away (a node's folder lock): a live
    writer's temporary would go too. Returns the paths removed; a folder that cannot be read removes nothing."""
    folder, base = os.path.split(path)
    prefix = base + _TMP
    removed: list[str] = []
    try:
        names = os.listdir(folder or ".")
    except OSError:
        return removed
    for name in names:
        if name.startswith(prefix) and name[len(prefix):].isdigit():
            p = os.path.join(folder, name)
            try:
                if not stat.S_ISDIR(os.lstat(p).st_mode):
                    os.unlink(p)
                    removed.append(p)
            except OSError:
                pass
    return removed
