"""A simulated GPU's memory ledger: the device bytes every job on it holds, so their sum never exceeds the GPU.

Each job enforces its own cap in its allocator (``torch_hooks/csrc/sim_allocator.cpp``); a real GPU also has a
total, which no cap of one job can hold when several jobs share it. The node makes one ledger per simulated GPU
(``create``), a small file in shared memory at ``ledger_path(node endpoint, gpu)``; every job on that GPU holds a
slot in it (``attach``) and its allocator reserves a new segment only while the reserved bytes of all the slots stay
within the GPU's total. Past it the allocation is what it is over the job's own cap: served from host memory, or
out of memory (``--on-cap error``), as a full GPU's unified memory or its allocator would do.

Layout (little-endian, ``SIZE`` bytes), as the C++ ``LedgerHead``/``LedgerSlot``::

    head (64 B): uint32 magic, uint32 version, uint64 total bytes, uint32 slots, padding
    slot (64 B) x SLOTS: int32 pid (0: free), int32 padding, uint64 reserved bytes, padding

Who may write what: the node writes the head (at its start; never the slots, so jobs that outlive a node restart
keep theirs); a job claims a free slot, or one whose process is gone, under ``flock`` of the file, and then writes
only its own slot's ``reserved``. Every check that admits a segment holds the ``flock``. The file is the node
account's, mode 0600: a job of another account cannot open it and runs held to its own cap only (``attach`` says
why).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import mmap
import os
import struct
import tempfile
from dataclasses import dataclass

MAGIC = 0x474C4443  # "CDLG"
VERSION = 1
SLOTS = 63
SLOT_BYTES = 64
HEAD_BYTES = 64
SIZE = HEAD_BYTES + SLOTS * SLOT_BYTES
_HEAD = struct.Struct("<IIQI")


def shared_path(kind: str, node_endpoint: str, gpu: int) -> str:
    """The shared-memory file ``kind`` (``mem``: this ledger; ``gate``: ``torch_hooks.gate``) of GPU ``gpu`` of the
    node at ``node_endpoint``: /dev/shm (else the temporary folder), named by a digest of the endpoint."""
    digest = hashlib.sha1(node_endpoint.encode()).hexdigest()[:12]
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return os.path.join(base, f"colocate-{kind}-{digest}-gpu{gpu}")


def ledger_path(node_endpoint: str, gpu: int) -> str:
    """Where the ledger of simulated GPU ``gpu`` of the node at ``node_endpoint`` lives (beside its gate block)."""
    return shared_path("mem", node_endpoint, gpu)


def create(path: str, total: int) -> None:
    """The node's side: make the ledger at ``path`` for a GPU of ``total`` bytes, or take over the one a previous
    run of this node left (its slots, the jobs still running, are kept). Raises OSError (a file of another account,
    a link, a folder) or ValueError (not a ledger)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            raise OSError(errno.EPERM, f"{path} belongs to another account (uid {st.st_uid})")
        fcntl.flock(fd, fcntl.LOCK_EX)
        if st.st_size not in (0, SIZE):
            raise ValueError(f"{path} is not a colocate memory ledger ({st.st_size} bytes)")
        if st.st_size == SIZE:
            magic, version, _total, _slots = _HEAD.unpack(os.pread(fd, _HEAD.size, 0))
            # all zeros: a node stopped between sizing the file and writing its head; no job can have a slot
            unwritten = magic == 0 and not any(os.pread(fd, SIZE, 0))
            if (magic, version) != (MAGIC, VERSION) and not unwritten:
                raise ValueError(f"{path} is not a colocate memory ledger of version {VERSION}")
        else:
            os.ftruncate(fd, SIZE)
        os.fchmod(fd, 0o600)
        os.pwrite(fd, _HEAD.pack(MAGIC, VERSION, int(total), SLOTS), 0)
    finally:
        os.close(fd)


def remove_if_unused(path: str) -> bool:
    """The node's side, at its stop: remove the ledger at ``path`` unless a live process holds a slot in it (a job
    that outlives the node keeps it for the node's next run). True when removed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        usage = read(path)
        if any(_alive(pid) for pid in usage.reserved):
            return False
        os.unlink(path)
        return True
    except (OSError, ValueError):
        return False
    finally:
        os.close(fd)


@dataclass
class Usage:
    """What a ledger says: ``total`` bytes, and the reserved bytes of each live slot by pid."""

    total: int
    reserved: dict[int, int]

    @property
    def used(self) -> int:
        return sum(self.reserved.values())


def read(path: str) -> Usage:
    """The ledger at ``path`` as it is now (for the node and tests; a slot whose process is gone still counts
    until a job reclaims it). Raises OSError or ValueError."""
    with open(path, "rb") as f:
        data = f.read(SIZE)
    if len(data) != SIZE:
        raise ValueError(f"{path} is not a colocate memory ledger")
    magic, version, total, slots = _HEAD.unpack_from(data, 0)
    if (magic, version, slots) != (MAGIC, VERSION, SLOTS):
        raise ValueError(f"{path} is not a colocate memory ledger of version {VERSION}")
    out: dict[int, int] = {}
    for i in range(SLOTS):
        pid, _pad, reserved = struct.unpack_from("<iiQ", data, HEAD_BYTES + i * SLOT_BYTES)
        if pid:
            out[pid] = out.get(pid, 0) + reserved
    return Usage(total, out)


class Slot:
    """A job's hold on a ledger: the mapping, the open file (for ``flock``) and its slot's index. The allocator
    extension gets ``address`` (the mapping's first byte), ``fd`` and ``index``; keep this object alive as long
    as the extension uses them."""

    def __init__(self, path: str, fd: int, mm: mmap.mmap, index: int, total: int):
        self.path, self.fd, self.mm, self.index, self.total = path, fd, mm, index, total
        self._anchor = ctypes.c_char.from_buffer(mm)  # pins the mapping: it is never closed under the extension

    @property
    def address(self) -> int:
        return ctypes.addressof(self._anchor)


def attach(path: str, reserved: int = 0) -> tuple[Slot | None, str]:
    """The job's side: claim a slot in the ledger at ``path`` for this process, holding ``reserved`` bytes now.
    (slot, "") or (None, why not: no node made one, another account's file, full)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None, "no ledger (the node has not made one)"
    except OSError as exc:
        return None, f"cannot open {path}: {exc.strerror}"
    try:
        if os.fstat(fd).st_size != SIZE:
            raise ValueError("not a ledger")
        mm = mmap.mmap(fd, SIZE)
    except (OSError, ValueError) as exc:
        os.close(fd)
        return None, f"{path}: {exc}"
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        magic, version, total, slots = _HEAD.unpack_from(mm, 0)
        if (magic, version, slots) != (MAGIC, VERSION, SLOTS):
            raise ValueError(f"{path} is not a colocate memory ledger of version {VERSION}")
        me, free = os.getpid(), None
        for i in range(SLOTS):
            pid = struct.unpack_from("<i", mm, HEAD_BYTES + i * SLOT_BYTES)[0]
            if pid == me or (free is None and (pid == 0 or not _alive(pid))):
                free = i
                if pid == me:
                    break
        if free is None:
            raise ValueError(f"{path}: all {SLOTS} slots are held by live processes")
        struct.pack_into("<iiQ", mm, HEAD_BYTES + free * SLOT_BYTES, me, 0, int(reserved))
        fcntl.flock(fd, fcntl.LOCK_UN)
        return Slot(path, fd, mm, free, total), ""
    except (OSError, ValueError) as exc:
        mm.close()
        os.close(fd)
        return None, str(exc)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another account's process
        return True
    return True
