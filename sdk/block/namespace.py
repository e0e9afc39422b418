"""KV namespaces: what makes two blocks interchangeable.

A block of KV cache is only valid for the exact model, dtype, tokens per
block, KV layout and parallel layout that produced it.  Every stored block
carries a fingerprint of all of them (and of the block format version), and
a tier answers a miss for any block whose fingerprint differs.

The tenant the block belongs to is part of that identity: each tenant is a
namespace of its own (docs/tenants.md).  Backends are handed a namespace by
its fingerprint, so every backend keeps tenants apart as it keeps models
apart, with no change to the contract; and the block's header names the
tenant, so whoever rebuilds an index from the blocks knows whose each is.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["DEFAULT_TENANT", "FORMAT_VERSION", "Namespace", "check_tenant"]

#: Version of the stored block format (header layout, codecs).  2: checksums
#: seeded with the shuffle width, large uncompressed payloads aligned.  3: the
#: header names the tenant, and a sealed (encrypted) block's key id and nonce.
FORMAT_VERSION = 3

#: The tenant of a request that names none.
DEFAULT_TENANT = "default"
# a tenant goes into every block header (at most 64 bytes there) and into
# metric labels and paths: plain characters only
_TENANT_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,63}")


def check_tenant(tenant: str) -> str:
    """``tenant`` if it is a valid tenant name, else a :class:`ValueError` saying why."""
    if not isinstance(tenant, str) or not _TENANT_RE.fullmatch(tenant):
        raise ValueError(
            f"a tenant is 1 to 64 characters, letters, digits and _ . : @ - (not first), "
            f"got {tenant!r}"
        )
    return tenant

_SHUFFLE_BY_DTYPE = {
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float32": 4,
    "fp32": 4,
    "float": 4,
}


@dataclass(frozen=True)
class Namespace:
    """Identity of a KV cache: two namespaces never share blocks.

    ``model`` is the model id (or any string naming the producer);
    ``parallel_layout`` names tensor/pipeline parallel sizes and the rank's
    share, e.g. ``"tp2-rank0"``; ``extra`` holds anything else that changes
    the bytes of a block (a KV quantisation scheme, a cache-dtype override).
    ``tenant`` names whose blocks these are (:data:`DEFAULT_TENANT` when a
    request names none); two tenants' namespaces never share a block.
    """

    model: str
    dtype: str = ""
    tokens_per_block: int = 0
    kv_layout: str = ""
    parallel_layout: str = ""
    extra: Mapping[str, str] = field(default_factory=dict)
    tenant: str = DEFAULT_TENANT
    #: Set only by :meth:`from_hex`, for servers that know a namespace by its fingerprint.
    known_fingerprint: bytes | None = field(default=None, repr=False, compare=False)

    @classmethod
    def from_hex(cls, fingerprint: str) -> Namespace:
        """A namespace known only by its 32-hex-digit fingerprint (a server's view).

        Its :attr:`fingerprint` is the given one; its dtype is unknown, so
        ``shuffle: auto`` does not shuffle.
        """
        try:
            digest = bytes.fromhex(fingerprint)
        except ValueError:
            digest = b""
        if len(digest) != 16 or digest.hex() != fingerprint:
            raise ValueError(
                f"a namespace fingerprint is 32 lowercase hex digits, got {fingerprint!r}"
            )
        return cls(model=f"<{fingerprint}>", known_fingerprint=digest)

    def __post_init__(self) -> None:
        check_tenant(self.tenant)

    def for_tenant(self, tenant: str | None, shared: Collection[str] = ()) -> Namespace:
        """This namespace for ``tenant``: the same model and layout, another identity.

        ``None`` is :data:`DEFAULT_TENANT`.  A tenant in ``shared`` (declared
        shared, e.g. for a system prompt every tenant may load) maps to the
        default tenant's namespace: its blocks are everyone's.
        """
        if tenant is None or tenant in shared:
            tenant = DEFAULT_TENANT
        if self.known_fingerprint is not None:
            raise ValueError("a namespace known only by its fingerprint has no other tenant")
        return replace(self, tenant=check_tenant(tenant))

    @classmethod
    def of(cls, value: Namespace | str | Mapping[str, Any]) -> Namespace:
        """A namespace from itself, a plain model string, or a mapping of fields."""
        if isinstance(value, Namespace):
            return value
        if isinstance(value, str):
            if not value:
                raise ValueError("a namespace needs a non-empty model name")
            return cls(model=value)
        if isinstance(value, Mapping):
            known = {"model", "dtype", "tokens_per_block", "kv_layout", "parallel_layout", "extra",
                     "tenant"}
            unknown = set(value) - known
            if unknown:
                raise ValueError(
                    f"unknown namespace field(s) {sorted(unknown)}; known: {sorted(known)}"
                )
            if not value.get("model"):
                raise ValueError("a namespace needs a non-empty 'model'")
            return cls(**value)
        raise TypeError(
            f"namespace must be a Namespace, str or mapping, not {type(value).__name__}"
        )

    def _canonical(self) -> bytes:
        doc = {
            "format": FORMAT_VERSION,
            "model": self.model,
            "dtype": self.dtype,
            "tokens_per_block": self.tokens_per_block,
            "kv_layout": self.kv_layout,
            "parallel_layout": self.parallel_layout,
            "extra": {str(k): str(v) for k, v in sorted(self.extra.items())},
            "tenant": self.tenant,
        }
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @property
    def fingerprint(self) -> bytes:
        """16 bytes identifying the namespace (BLAKE2b over its canonical form)."""
        if self.known_fingerprint is not None:
            return self.known_fingerprint
        return hashlib.blake2b(self._canonical(), digest_size=16).digest()

    @property
    def hex(self) -> str:
        """The fingerprint as 32 lowercase hex characters (safe in paths and keys)."""
        return self.fingerprint.hex()

    def shuffle_width(self) -> int:
        """Element size for byte-shuffle when a tier says ``shuffle: auto``."""
        return _SHUFFLE_BY_DTYPE.get(self.dtype.lower().removeprefix("torch."), 0)
