"""How the ``fs`` backend tells a fault of one block from a fault of the tier.

A fault of one block (its file unreadable, unwritable or unremovable: a
``chmod 000`` file, a bad sector's ``EIO``) makes that block a miss, a
refused put or an eviction that removed nothing, and is counted in the
backend's ``block_faults``; the batch goes on, and so does the tier.  A
fault of the whole tier (the mount gone, the device full, a stale handle, a
network filesystem's server down) still fails the call, and the chain backs
the tier off.  The rule, in docs/reliability.md:

* an ``OSError`` whose errno is in :data:`BLOCK_ERRNOS` is a fault of its
  block when another item of the same batch succeeded, or else when a
  probe of the tier's root succeeds (listing it for reads, writing and
  removing a scratch file for writes and removals);
* any other fault (another errno such as ``ENOSPC``, ``ENODEV``,
  ``ESTALE``, ``EROFS``, a remote filesystem's own error, or a block
  errno with the probe failing too) is the tier's, and is raised.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from kvtier.spec import Failed, KvtierError

__all__ = ["BLOCK_ERRNOS", "BlockFaults"]

log = logging.getLogger("kvtier.backends.fs")

R = TypeVar("R")

#: Errnos that one file can raise while its neighbours are fine: permissions,
#: a damaged inode or sector, something else in the file's place.
BLOCK_ERRNOS = frozenset(
    code
    for code in (
        errno.EACCES,
        errno.EPERM,
        errno.EIO,
        errno.ELOOP,
        errno.EISDIR,
        errno.ENOTDIR,
        errno.EBADMSG,
        getattr(errno, "EUCLEAN", None),  # a damaged structure (ext4, xfs, btrfs)
    )
    if code is not None
)

#: Block faults logged one by one; after these, one in every _LOG_EVERY.
_LOG_FIRST = 16
_LOG_EVERY = 1024


def is_block_errno(exc: BaseException) -> bool:
    return (
        isinstance(exc, OSError)
        and not isinstance(exc, KvtierError)
        and exc.errno in BLOCK_ERRNOS
    )


class BlockFaults:
    """Turns the faults of single blocks into misses, counts and logs them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0
        self.url = ""  # the tier's, redacted, for the log

    def settle(
        self,
        outcomes: Sequence[R | Failed[Exception]],
        miss: R,
        probe: Callable[[], object],
        what: str,
    ) -> tuple[list[R], list[int]]:
        """``outcomes`` with each block's fault replaced by ``miss``; and where they were.

        Raises the first fault in item order that is the tier's: see the
        module's docstring.  ``probe`` raises if the tier itself is faulty.
        """
        faulted = [i for i, out in enumerate(outcomes) if isinstance(out, Failed)]
        if not faulted:
            return list(outcomes), []  # type: ignore[arg-type]  # no Failed in it
        first: Exception = outcomes[faulted[0]].exc  # type: ignore[union-attr]
        for i in faulted:
            exc: Exception = outcomes[i].exc  # type: ignore[union-attr]
            if not is_block_errno(exc):
                raise exc
        if len(faulted) == len(outcomes):
            # nothing in the batch went well: ask the tier itself
            try:
                probe()
            except Exception:
                raise first from None
        settled = list(outcomes)
        for i in faulted:
            settled[i] = miss
        self._note(what, [outcomes[i].exc for i in faulted])  # type: ignore[union-attr]
        return settled, faulted  # type: ignore[return-value]  # every Failed replaced

    def _note(self, what: str, faults: list[Exception]) -> None:
        with self._lock:
            before = self.count
            self.count += len(faults)
        for n, exc in enumerate(faults, before + 1):
            if n <= _LOG_FIRST or n % _LOG_EVERY == 0:
                log.warning(
                    "fs tier %s: %s: %r; a fault of this block only, which is a miss (the "
                    "tier goes on; %d block fault(s) so far, counted in block_faults)",
                    self.url, what, exc, n,
                )
