"""Where the ``fs`` pool (:mod:`kvtier.backends.fs.pool`) is not used: roots on a network
filesystem, whose locks SQLite cannot trust, or whose sharers are on other machines
(a sharer there cannot be told dead by its pid).
"""

from __future__ import annotations

import os

__all__ = ["NETWORK_FS", "network_fs"]

#: Filesystems whose locking SQLite cannot trust, or whose sharers are on other machines.
NETWORK_FS = frozenset({
    "nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "ceph", "fuse.ceph", "fuse.cephfs",
    "glusterfs", "fuse.glusterfs", "gpfs", "beegfs", "9p", "fuse.sshfs", "afs", "ocfs2",
    "gfs2", "fuse.s3fs", "fuse.juicefs", "fuse.gcsfuse",
})


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
