"""A tier's health: the breaker that backs a failing tier off, and the tier that failed at open.

A tier whose backend raises is skipped for a growing while (:class:`Health`):
its reads are misses, its writes are skipped and counted, and the next call
after the back-off tries the backend again.

A chain's tier whose backend faults at open (a server that refuses
connections, a root that cannot be written) does not stop the chain either:
the tier starts failed, as if its backend had just raised in use, and
:class:`Reopen` opens a fresh instance of the backend each time the tier's
back-off ends, with the same growing back-off, until one opens.  The
attempts run on a thread of their own: an open can take a whole connect
timeout, or a scan of the tier's store, which no caller's read should wait
for.  A tier configured ``required: true``, and an error ``kvtier config
validate`` could have named (:class:`~kvtier.spec.ConfigError`), fail the
open instead.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kvtier.spec import Capabilities

if TYPE_CHECKING:
    from kvtier.chain.tier import Tier
    from kvtier.plugins.registry import BackendHandle

__all__ = ["Health", "Reopen", "close_quietly"]

log = logging.getLogger("kvtier.chain.tier")

_NUMBER_RE = re.compile(r"\d+(?:\.\d+)?")

_BACKOFF_FIRST = 0.5
_BACKOFF_MAX = 30.0


class Health:
    """Circuit breaker: after a fault the tier is skipped for a growing while."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.down_until = 0.0
        self.backoff = 0.0
        self.last_error = ""

    def available(self) -> bool:
        return time.monotonic() >= self.down_until

    def fault(self, error: str) -> float:
        with self.lock:
            self.backoff = min(_BACKOFF_MAX, self.backoff * 2 or _BACKOFF_FIRST)
            self.down_until = time.monotonic() + self.backoff
            self.last_error = error
            return self.backoff

    def ok(self) -> None:
        if self.backoff:
            with self.lock:
                self.backoff = 0.0
                self.down_until = 0.0


class Reopen:
    """A chain's tier whose backend raised ``exc`` at open: it starts failed, and
    each time its back-off ends a fresh backend from ``fresh()`` is opened,
    until one opens and the tier adopts it; then ``opened()`` is called.

    A failed attempt trips the tier's breaker again, with a longer back-off.
    ``start`` once the tier holds this (an attempt's success clears it);
    ``stop`` ends the attempts: one under way finishes, and closes what it
    opened when the tier no longer takes it.
    """

    def __init__(self, tier: Tier, exc: Exception, fresh: Callable[[], BackendHandle],
                 opened: Callable[[], None] | None) -> None:
        self._tier, self._fresh, self._opened = tier, fresh, opened
        self._label = f"{tier.name!r} ({tier.config.backend})"
        self._health = tier.health
        try:  # what the chain plans with until the backend opens (answered before open)
            tier.capabilities = tier.handle.capabilities()
        except Exception:
            tier.capabilities = Capabilities()
        backoff = self._health.fault(repr(exc))
        log.warning("tier %s did not open: %s; it starts failed (reads miss, writes are "
                    "skipped) and is retried in %.1fs, then after a growing back-off "
                    "(required: true fails the open instead)", self._label, exc, backoff)
        self._stop = threading.Event()
        self.attempts = 1  # the open that failed
        self._thread = threading.Thread(target=self._run, name=f"kvtier-open-{tier.name}",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        last = _gist(self._health.last_error)  # the failed open's, a warning already
        while not self._stop.wait(max(0.0, self._health.down_until - time.monotonic())):
            self.attempts += 1
            try:
                self._attempt()
                return
            except Exception as exc:
                backoff = self._health.fault(repr(exc))
                # the same failure again is not news (its timings may differ)
                level = logging.INFO if _gist(repr(exc)) == last else logging.WARNING
                last = _gist(repr(exc))
                log.log(level, "tier %s still does not open (attempt %d): %s; retried in %.1fs",
                        self._label, self.attempts, exc, backoff)

    def _attempt(self) -> None:
        tier = self._tier
        handle = self._fresh()
        try:
            handle.open(tier.options_for(handle), tier.namespace.hex)
        except BaseException:
            close_quietly(handle)  # half opened, perhaps: let it free what it took
            raise
        if not tier.adopt(handle):
            close_quietly(handle)  # the tier closed while this instance opened
            return
        self._health.ok()
        log.warning("tier %s opened after %d attempt(s); it takes reads and writes now",
                    self._label, self.attempts)
        if self._opened is not None:
            try:
                self._opened()
            except Exception:  # the tier is open; what follows its opening is best effort
                log.exception("tier %s: after its late open", self._label)


def _gist(error: str) -> str:
    """An error's text without its numbers: two timings of one failure read the same."""
    return _NUMBER_RE.sub("#", error)


def close_quietly(handle: BackendHandle) -> None:
    """Close a backend instance that never opened, or one a tier no longer uses."""
    try:
        handle.close()
    except Exception as exc:
        log.debug("closing an unused backend instance failed: %r", exc)
