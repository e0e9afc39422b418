"""The chain's asynchronous surface: a call started now, its result polled for later.

Engines call from a scheduler thread that must not wait on storage: a job
runs the chain's synchronous call on a worker thread and is reported once
by :meth:`Jobs.poll`.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Literal

from kvtier.observe import phases
from kvtier.spec import ClosedError

__all__ = ["JobKind", "JobResult", "Jobs"]

JobKind = Literal["put", "get", "lookup"]


@dataclass(frozen=True)
class JobResult:
    """A finished asynchronous job.

    ``result`` is what the synchronous call would have returned; ``error``
    is set (and ``result`` empty) only if the chain itself failed, which
    backend faults never cause.
    """

    job_id: int
    kind: JobKind
    result: list[Any]
    error: BaseException | None = None


class Jobs:
    """Jobs running on a pool of worker threads, each reported once when done."""

    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="kvtier-job")
        self._ids = itertools.count(1)
        self._running: dict[int, Future[None]] = {}
        self._done: list[JobResult] = []
        self._lock = threading.Lock()
        self._closing = False

    def submit(self, kind: JobKind, fn: Callable[..., Iterable[Any]], *args: Any) -> int:
        """Run ``fn(*args)`` on a worker; returns the job's id at once."""
        if self._closing:
            raise ClosedError("chain is closed")
        job_id = next(self._ids)
        submitted = time.perf_counter() if phases.ENABLED else 0.0

        def run() -> None:
            started = time.perf_counter() if phases.ENABLED else 0.0
            try:
                res = JobResult(job_id, kind, list(fn(*args)))
            except BaseException as exc:
                res = JobResult(job_id, kind, [], exc)
            if phases.ENABLED:  # how long it queued for a worker, then ran
                phases.span(f"{kind} queued", submitted, started, len(res.result))
                phases.span(f"{kind} job", started, time.perf_counter(), len(res.result))
            with self._lock:
                self._done.append(res)
                self._running.pop(job_id, None)

        with self._lock:
            self._running[job_id] = self._pool.submit(run)
        return job_id

    def poll(self) -> list[JobResult]:
        with self._lock:
            done, self._done = self._done, []
        if phases.ENABLED and done:  # when the engine heard of each job
            now = time.perf_counter()
            for res in done:
                phases.span(f"{res.kind} polled", now, now, len(res.result))
        return done

    def wait(self, job_ids: Iterable[int] | None, timeout: float | None) -> bool:
        with self._lock:
            if job_ids is None:
                futures = list(self._running.values())
            else:
                futures = [f for j in job_ids if (f := self._running.get(j)) is not None]
        _, not_done = wait_futures(futures, timeout)
        return not not_done

    def stop(self) -> bool:
        """Take no new jobs; True the first time only (the caller then closes the chain)."""
        with self._lock:
            first, self._closing = not self._closing, True
        return first

    def shutdown(self) -> None:
        """Let running jobs finish."""
        self._pool.shutdown(wait=True)
