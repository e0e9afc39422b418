"""What the ``fs`` pool (:mod:`kvtier.backends.fs.pool`) keeps beside a root, and where it may.

Its options and their checks, the mounts where it is not used (their locks
cannot be trusted, or their sharers are on other machines), whether a sharer
is alive, and each writer's journal: ``<root>/.kvtier-pool.db.writer-<id>``,
the keys a process may be writing from its credit, appended before their
files are written, so that the files of a process that died can be counted.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping

from kvtier.spec import Option, Renamed
from kvtier.spec.shared import TIMEOUT, but

__all__ = ["DB_NAME", "LEASE_MIN_S", "POOL_OPTIONS", "alive", "journal_keys", "journal_path",
           "network_fs", "parse_min_free"]

DB_NAME = ".kvtier-pool.db"
#: Filesystems whose locking SQLite cannot trust, or whose sharers are on other machines.
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "ceph", "fuse.ceph", "fuse.cephfs",
    "glusterfs", "fuse.glusterfs", "gpfs", "beegfs", "9p", "fuse.sshfs", "afs", "ocfs2",
    "gfs2", "fuse.s3fs", "fuse.juicefs", "fuse.gcsfuse",
})
_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def _check_min_free(value: str | int) -> None:
    parse_min_free(value)


#: The shortest ``pool_lease``: a put waits for the lease, or for the writes of other
#: processes to land and get their rows (so that they can be evicted), at most this
#: long.  Those rows are made within ``_STALE_S`` (0.5 s) while their writer puts:
#: a shorter wait refuses puts that would fit a moment later (0s refused 164-194
#: puts per writer of four).  Twice that, so that one late flush still fits.
LEASE_MIN_S = 1.0


def _check_lease(value: float) -> None:
    if value < LEASE_MIN_S:
        raise ValueError(
            f"expected at least {LEASE_MIN_S:g}s, got {value:g}s: a put waits this long for "
            "another process's eviction or writes in flight (their rows come within 0.5s), "
            "so a shorter lease refuses puts that would fit")


def parse_min_free(value: str | int) -> tuple[int, float]:
    """``(bytes, fraction)``: one of them is 0."""
    from kvtier.plugins.options import parse_size  # the options' own parser, one home

    match = _PERCENT_RE.match(str(value))
    if match:
        pct = float(match.group(1))
        if not 0 < pct < 100:
            raise ValueError(f"expected a percent between 0 and 100, got {value!r}")
        return 0, pct / 100
    size = parse_size(value)
    if size < 1:
        raise ValueError(f"expected bytes (4GiB) or a percent (10%), got {value!r}")
    return size, 0.0


def _scope_of_pool(pool: bool, scope: str | None) -> str | None:
    """The old ``pool: false`` is ``capacity_scope: process``; with ``capacity_scope: pool``
    it is a contradiction (no pool to bound), refused."""
    if pool:
        return scope
    if scope == "pool":
        raise ValueError("pool: false contradicts capacity_scope: pool (every namespace of the "
                         "root needs the shared index); write capacity_scope: process or pool")
    return "process"


POOL_OPTIONS: Mapping[str, Option] = {
    "capacity_scope": Option(
        "str",
        "what the capacity and min_free bound, on a local root: namespace (this tier's "
        "namespace, for every process sharing the root together: a shared index, "
        "<root>/.kvtier-pool.db), pool (every namespace of the root together) or process "
        "(each process its own blocks, no shared index)",
        default="namespace",
        choices=("namespace", "pool", "process"),
        was=(Renamed("pool", "bool", _scope_of_pool),),
    ),
    "min_free": Option(
        "size_or_percent",
        "local roots: keep this much of the filesystem free (4GiB, 4096 or 10%): puts evict to "
        "stay above it, and are refused when they cannot",
        default=None,
        check=_check_min_free,
    ),
    "pool_lease": but(
        TIMEOUT,
        help="how long the evictor's lease lasts (at least 1s): a dead evictor is replaced "
        "within it, and a put waits at most this long for room",
        default="10s",
        check=_check_lease,
    ),
}


def network_fs(path: str) -> str | None:
    """The type of the network filesystem holding ``path``, or None for a local one."""
    real = os.path.realpath(path)
    best, kind = "", ""
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                fields = line.split()
                if len(fields) < 3:
                    continue
                point = fields[1].replace("\\040", " ")
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best):
                    best, kind = point, fields[2]
    except OSError:
        return None  # no /proc: nothing to tell
    return kind if kind in NETWORK_FS else None


def alive(writer: str) -> bool:
    try:
        os.kill(int(writer.split(":", 1)[0]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True




def journal_path(root: str, writer: str) -> str:
    """The file where ``writer`` lists the keys it may be writing (see :class:`SharedPool`)."""
    return os.path.join(root, f"{DB_NAME}.writer-{writer.replace(':', '-')}")


def journal_keys(path: str) -> set[bytes]:
    """The keys a journal lists; a line that is not a key (torn by a crash) is skipped."""
    try:
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
    except FileNotFoundError:
        return set()
    keys = set()
    for line in lines:
        with contextlib.suppress(ValueError):
            keys.add(bytes.fromhex(line.decode("ascii")))
    keys.discard(b"")
    return keys
