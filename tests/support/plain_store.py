"""A third-party backend of the four required hooks and none of the optional ones
(no ``kvtier_keep``, no ``kvtier_expire``): what the chain does for a tier that
cannot take a hint it passes on."""

from __future__ import annotations

from kvtier.spec import BlockStore


class PlainStore(BlockStore):
    """Blocks in a dict; put, get, lookup and evict only."""

    name = "plain"

    def _open(self, options: object, namespace: str) -> None:
        self.blocks: dict[bytes, bytes] = {}

    def _put(self, keys, blocks, evicted):  # type: ignore[no-untyped-def]
        self.blocks.update((k, bytes(b)) for k, b in zip(keys, blocks, strict=True))
        return [True] * len(keys)

    def _get(self, keys):  # type: ignore[no-untyped-def]
        return [self.blocks.get(k) for k in keys]

    def _lookup(self, keys):  # type: ignore[no-untyped-def]
        return [k in self.blocks for k in keys]

    def _evict(self, keys):  # type: ignore[no-untyped-def]
        return [self.blocks.pop(k, None) is not None for k in keys]
