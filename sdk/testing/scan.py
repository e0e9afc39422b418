"""Group ``scan``: ``kvtier_scan`` lists exactly what the store holds (contract 1.1).

Operators' tools trust a listing to act on: ``kvtier purge`` deletes what it
names, ``kvtier scrub`` reads and verifies it, ``kvtier inspect`` sums its
sizes.  So a listing must name every block the namespace holds and nothing
else (no evicted block, no bookkeeping, no other namespace's block under
this one), with the size ``kvtier_get`` returns, and reading it must change
nothing.  Keys are counted distinct: the contract lets a store list a key
twice.
"""

from __future__ import annotations

import secrets
import time

from kvtier.spec import ScanEntry

from .base import KitBase, kit_group
from .data import block_for, key_of

__all__ = ["ScanTests"]

#: Seconds an ``mtime`` may lie outside the put it dates: stores keep whole
#: seconds (S3's Last-Modified) or coarse file-system timestamps.
MTIME_SLACK = 2.0


def _sizes_listed(entries: list[ScanEntry], namespace: str) -> dict[bytes, set[int]]:
    out: dict[bytes, set[int]] = {}
    for entry in entries:
        if entry.namespace == namespace:
            out.setdefault(entry.key, set()).add(entry.size)
    return out


@kit_group("scan")
class ScanTests(KitBase):
    """Runs for backends that implement ``kvtier_scan``."""

    def _put_blocks(self, tag: str, count: int) -> dict[bytes, bytes]:
        keys = [key_of(tag, i) for i in range(count)]
        blocks = {key: block_for(key, 200 + 131 * i) for i, key in enumerate(keys)}
        evicted: list[tuple[bytes, bytes]] = []
        flags = self.store.put(list(blocks), list(blocks.values()), evicted)
        assert flags == [True] * count, (
            f"put answered {flags} where [True] * count was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        for key, _ in evicted:
            blocks.pop(key, None)
        return blocks

    def _check_listing(self, held: dict[bytes, bytes], namespace: str | None, note: str) -> None:
        entries = self.store.scan(namespace)
        if namespace is not None:
            strays = sorted({e.namespace for e in entries} - {namespace})
            assert not strays, (
                f"{note}: kvtier_scan({namespace!r}) listed blocks of other namespaces: {strays}"
            )
        sizes = _sizes_listed(entries, self.namespace)
        never = sorted(set(sizes) - set(held))
        assert not never, f"{note}: listed keys this namespace does not hold: {never[:5]}"
        missing = sorted(set(held) - set(sizes))
        assert not missing, f"{note}: keys the namespace holds are not listed: {missing[:5]}"
        for key, data in held.items():
            assert sizes[key] == {len(data)}, (
                f"{note}: {key!r} listed with size {sorted(sizes[key])}, but kvtier_get "
                f"returns {len(data)} bytes: a size is the stored block's length"
            )

    def test_scan_lists_exactly_what_is_held(self) -> None:
        held = self._put_blocks("scan", 12)
        for key in list(held)[:3]:
            flags = self.store.evict([key])
            assert flags == [True], (
                f"evict answered {flags} where [True] was expected: "
                "evict answers True exactly where it removed a stored block"
            )
            del held[key]
        self._check_listing(held, self.namespace, "after 12 puts and 3 evicts")
        self._check_listing(held, None, "listing every namespace")

    def test_scan_keeps_namespaces_apart(self) -> None:
        mine = self._put_blocks("scan-ns", 4)
        other_ns = secrets.token_hex(16)
        other = self.open_backend(other_ns)
        theirs = {key_of("scan-ns", i): block_for(key_of("scan-ns", i) + b"/o", 90 + i)
                  for i in range(2)}
        flags = other.put(list(theirs), list(theirs.values()))
        assert flags == [True, True], (
            f"put answered {flags} where [True, True] was expected: "
            "a put of blocks within the declared limits stores each and answers True"
        )
        self._check_listing(mine, self.namespace, "beside another namespace")
        # the other instance lists its own blocks under its own name
        listed = _sizes_listed(other.scan(other_ns), other_ns)
        assert listed == {k: {len(v)} for k, v in theirs.items()}, (
            f"the other namespace's instance listed {sorted(listed)}, not its 2 blocks"
        )
        # a listing of every namespace never files one namespace's blocks under the other
        for entry in self.store.scan(None):
            if entry.namespace == other_ns:
                assert entry.key in theirs and entry.size == len(theirs[entry.key]), (
                    f"listed {entry.key!r} of {other_ns} with size {entry.size}, "
                    "which that namespace does not hold"
                )

    def test_scan_changes_nothing(self) -> None:
        held = self._put_blocks("scan-quiet", 6)
        before = self.store.stats()
        self.store.scan(self.namespace)
        self.store.scan(None)
        after = self.store.stats()
        for name in ("used_bytes", "blocks"):
            if name in before:
                assert after.get(name) == before[name], (
                    f"kvtier_scan changed {name} from {before[name]} to {after.get(name)}: "
                    "a scan is not a use and stores nothing"
                )
        assert self.store.get(list(held)) == list(held.values()), "a block changed after a scan"

    def test_scan_mtime_dates_the_put(self) -> None:
        started = time.time()
        held = self._put_blocks("scan-time", 3)
        ended = time.time()
        for entry in self.store.scan(self.namespace):
            if entry.key not in held or entry.mtime is None:
                continue
            assert started - MTIME_SLACK <= entry.mtime <= ended + MTIME_SLACK, (
                f"{entry.key!r} listed with mtime {entry.mtime:.3f}, but it was stored "
                f"between {started:.3f} and {ended:.3f} (seconds since the epoch)"
            )
