"""Run one worker function on several threads at once, for the concurrency tests."""

from __future__ import annotations

import threading
from collections.abc import Callable


def run_workers(worker: Callable[[int], object], count: int) -> None:
    """``worker(0)`` to ``worker(count - 1)``, each on its own thread, all started before any is
    waited for; returns when every one has returned.  A worker reports its failures itself (an
    exception on a thread does not reach the test)."""
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
