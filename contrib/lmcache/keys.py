"""LMCache ``ObjectKey`` to kvtier key.

An ``ObjectKey`` (LMCache 0.5) names one chunk of KV: ``chunk_hash`` (bytes),
``model_name``, ``kv_rank``, ``object_group_id`` and ``cache_salt``.  Every
field goes into the kvtier key, so two keys that differ in any field (two
users' salts above all) never name the same block: the block header carries
the key and a read checks it, so a block stored for one salt cannot be served
for another even by a tier that mixed up its files.

LMCache forbids ``@`` in ``model_name`` and ``cache_salt`` and the integers
cannot contain it, so ``model@rank@group@salt@`` followed by the raw hash is
unambiguous.  Keys longer than kvtier's :data:`~kvtier.spec.MAX_KEY_SIZE`
(a long model name) become a BLAKE2b digest of that same text, behind a
marker byte that no readable key starts with.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

from kvtier.spec import MAX_KEY_SIZE

__all__ = ["DIGEST_MARKER", "ObjectKeyLike", "kvtier_key"]

#: First byte of a digested key; a readable key starts with the model's name.
DIGEST_MARKER = b"\x00"


class ObjectKeyLike(Protocol):
    """The fields of LMCache's ``ObjectKey`` that identify a chunk."""

    @property
    def chunk_hash(self) -> bytes: ...
    @property
    def model_name(self) -> str: ...
    @property
    def kv_rank(self) -> int: ...
    @property
    def object_group_id(self) -> int: ...
    @property
    def cache_salt(self) -> str: ...


def kvtier_key(key: ObjectKeyLike, *, salt: str | None = None) -> bytes:
    """The kvtier key of one LMCache ``ObjectKey``: all five fields, at most 64 bytes.

    ``salt`` stands in for the key's ``cache_salt`` (``""``: a tenant's key,
    whose namespace already says whose it is, :mod:`.tenancy`).
    """
    salt = key.cache_salt if salt is None else salt
    for text, name in ((key.model_name, "model_name"), (salt, "cache_salt")):
        if "@" in text:  # LMCache's own invariant; checked again, the key depends on it
            raise ValueError(f"{name} must not contain '@' (got {text!r})")
    head = f"{key.model_name}@{key.kv_rank}@{key.object_group_id}@{salt}@"
    full = head.encode() + bytes(key.chunk_hash)
    if len(full) <= MAX_KEY_SIZE and not full.startswith(DIGEST_MARKER):
        return full
    return DIGEST_MARKER + hashlib.blake2b(full, digest_size=32).digest()
