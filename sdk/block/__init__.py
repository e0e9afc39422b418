"""Blocks as stored: the self-describing frame and the namespace it belongs to,
and :mod:`~kvtier.block.buffers`, what a backend does with a block's buffers
(byte counts, gather and scatter lists, copies).

May import only :mod:`kvtier.spec`; everything above builds on it.

Its one C extension, ``_xxh3copy``, copies a payload and takes its checksum
in one pass; :mod:`~kvtier.block.framing` uses it when it was built.
"""

from __future__ import annotations

from kvtier.block.framing import Codec, Header
from kvtier.block.namespace import FORMAT_VERSION, Namespace

__all__ = ["FORMAT_VERSION", "Codec", "Header", "Namespace"]
