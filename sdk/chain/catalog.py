"""Namespace descriptors: what a namespace fingerprint stands for, kept in the store itself.

A stored block names its namespace only by a 16-byte fingerprint (see
:mod:`kvtier.block.framing`), which an operator cannot read.  So when a chain
opens a persistent tier, it also records the namespace's description (model,
dtype, tokens per block, layouts, extras) in that tier's store, in a
namespace of its own, the **catalog**: the fingerprint of
``Namespace(model="kvtier/catalog")``.  There the key is the described
namespace's fingerprint and the block a framed JSON document, the same
canonical form the fingerprint is computed from.

Why a namespace of its own: keys are only unique within a namespace, so a
reserved key among a namespace's blocks could collide with an engine's key,
and it would count against that namespace's capacity and be evicted with its
blocks.  The catalog namespace is kept apart by the contract itself.

Descriptors are self-checking: :func:`read_descriptors` keeps one only when
the fingerprint computed from its fields is the key it is stored under, so a
corrupt or forged descriptor can never make one namespace pass for another.
Recording is best effort: a failure is logged and never fails the chain.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvtier.block.namespace import FORMAT_VERSION, Namespace
from kvtier.chain.tier import Tier
from kvtier.spec import CorruptBlockError

if TYPE_CHECKING:
    from kvtier.config.chain_config import TierConfig
    from kvtier.plugins.registry import BackendRegistry

__all__ = ["CATALOG", "CATALOG_HEX", "describe", "read_descriptors", "record", "record_opened"]

log = logging.getLogger("kvtier.chain.catalog")

#: The namespace descriptors live in.
CATALOG = Namespace(model="kvtier/catalog")
CATALOG_HEX = CATALOG.hex
_FIELDS = ("model", "dtype", "tokens_per_block", "kv_layout", "parallel_layout", "extra",
           "tenant")
#: Largest descriptor read back; real ones are a few hundred bytes.
_MAX_DESCRIPTOR = 64 << 10


def describe(namespace: Namespace) -> dict[str, Any]:
    """The namespace's fields as a JSON-able mapping, with the block format version."""
    return {
        "format": FORMAT_VERSION,
        "model": namespace.model,
        "dtype": namespace.dtype,
        "tokens_per_block": namespace.tokens_per_block,
        "kv_layout": namespace.kv_layout,
        "parallel_layout": namespace.parallel_layout,
        "extra": {str(k): str(v) for k, v in sorted(namespace.extra.items())},
        "tenant": namespace.tenant,
    }


def record(config: TierConfig, registry: BackendRegistry, namespace: Namespace) -> None:
    """Store ``namespace``'s descriptor in the tier's catalog, unless it is there already.

    Namespaces known only by their fingerprint (``kvtier serve``'s view) have
    nothing to record.
    """
    if namespace.known_fingerprint is not None or namespace == CATALOG:
        return
    try:
        tier = open_catalog(config, registry)
    except Exception as exc:
        log.info("tier %r: namespace descriptor not recorded: %r", config.name, exc)
        return
    try:
        key = namespace.fingerprint
        if not tier.lookup([key])[0]:
            document = json.dumps(describe(namespace), sort_keys=True).encode()
            tier.put_payloads([key], [document])
    except Exception as exc:
        log.info("tier %r: namespace descriptor not recorded: %r", config.name, exc)
    finally:
        tier.close()


def record_opened(tier: Tier, registry: BackendRegistry) -> None:
    """:func:`record` for a chain's tier whose backend opened (at the chain's open, or later):
    so that operators' tools can say which model a namespace of a persistent tier is."""
    if tier.capabilities.persistent:
        record(tier.config, registry, tier.namespace)


def open_catalog(config: TierConfig, registry: BackendRegistry) -> Tier:
    """The tier's store opened on the catalog namespace, uncompressed.

    Operators' tools also use it as the instance that lists every namespace.
    """
    plain = replace(config, codec="none", write="through")
    tier = Tier(plain, registry.create(config.backend), CATALOG)
    tier.open()
    return tier


def read_descriptors(catalog: Tier, fingerprints: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Descriptors the catalog holds, that check out, of the namespaces (hex) given."""
    wanted = [bytes.fromhex(h) for h in fingerprints if h != CATALOG_HEX]
    found: dict[str, dict[str, Any]] = {}
    for start in range(0, len(wanted), 256):
        keys = wanted[start : start + 256]
        for key, payload in zip(keys, catalog.get_payloads(keys)):
            if payload is None or len(payload) > _MAX_DESCRIPTOR:
                continue
            fields = _checked(key, payload)
            if fields is not None:
                found[key.hex()] = fields
    return found


def _checked(key: bytes, payload: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(payload)
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT_VERSION:
            return None
        namespace = Namespace.of({name: doc[name] for name in _FIELDS if name in doc})
    except (ValueError, TypeError, CorruptBlockError):
        return None
    if namespace.fingerprint != key:
        return None  # not the namespace it claims to describe
    return describe(namespace)
