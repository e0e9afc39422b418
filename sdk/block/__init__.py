"""Blocks as stored: the self-describing frame and the namespace it belongs to.

Imports only :mod:`kvtier.spec`; everything above builds on it.
"""

from __future__ import annotations

from kvtier.block.framing import Codec, Header
from kvtier.block.namespace import FORMAT_VERSION, Namespace

__all__ = ["FORMAT_VERSION", "Codec", "Header", "Namespace"]
