"""What the LMCache adapter signals and counts: its eventfds and its counters."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["Counters", "EventFd"]


@dataclass
class Counters:
    """What the adapter did, for ``report_status``."""

    stores: int = 0
    store_failures: int = 0
    lookups: int = 0
    locked: int = 0
    lock_copies: int = 0
    lock_over_budget: int = 0
    load_hits: int = 0
    load_misses: int = 0
    deletes_deferred: int = 0
    job_errors: int = 0


class EventFd:
    """One Linux eventfd, non-blocking, closed on exec (as LMCache's own)."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def signal(self) -> None:
        if self.fd >= 0:
            os.eventfd_write(self.fd, 1)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
