"""What the kit stored, by namespace, so that a test leaves the store as it found it."""

from __future__ import annotations

import threading
from collections.abc import Iterable

__all__ = ["Footprint"]


class Footprint:
    """Keys stored per namespace during one test (thread-safe: the concurrency group adds too)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, set[bytes]] = {}

    def add(self, namespace: str, keys: Iterable[bytes]) -> None:
        """Record that ``keys`` may now be stored in ``namespace``."""
        with self._lock:
            self._keys.setdefault(namespace, set()).update(keys)

    def take(self) -> dict[str, list[bytes]]:
        """Everything recorded, sorted, and forget it."""
        with self._lock:
            keys, self._keys = self._keys, {}
        return {ns: sorted(found) for ns, found in keys.items()}
