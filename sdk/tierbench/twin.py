"""The plaintext twin ``kvtier bench`` sets beside a tier with ``encrypt``.

An encrypted tier's cost is what it takes over the same tier without
encryption, on the same medium, in the same moments.  So each tier whose
``encrypt`` is set gets, besides its raw ceilings, a :class:`PlaintextTwin`:
the same tier entry with ``encrypt: none``, in a directory (fs) or prefix
(object) of its own, run through kvtier in the same rounds, on the same
blocks and buffers, in alternating order.  Its row's ratio columns then read
as encrypted / plaintext; ``kvtier bench`` also prints each operation's cost
in percent from the median batch times.

``--encrypt`` adds, to the built-in backends, an encrypted ``fs`` tier (and
an encrypted ``object`` tier where one runs) under a fresh master key in a
file of the bench's scratch directory.
"""

from __future__ import annotations

import dataclasses
import secrets
from pathlib import Path
from typing import Any

from kvtier.block.namespace import Namespace
from kvtier.chain.chain import Chain
from kvtier.config.chain_config import ChainConfig, MetricsConfig, TierConfig
from kvtier.plugins.options import with_values
from kvtier.tierbench.ceilings import Raw, drop_page_cache, warm_page_cache

__all__ = ["LABEL", "PlaintextTwin", "encrypted_entries", "is_encrypted"]

#: The twin's name in the report's ceilings.
LABEL = "kvtier plaintext"


def is_encrypted(tier: TierConfig) -> bool:
    return tier.encrypt.strip() not in ("", "none")


def encrypted_entries(entries: list[dict[str, Any]], scratch: Path) -> list[dict[str, Any]]:
    """For ``--encrypt``: each built-in fs tier with O_DIRECT, and the object tier, again
    with ``encrypt`` on, under a fresh master key kept in ``scratch``."""
    key = scratch / "bench-master.key"
    key.write_text(secrets.token_hex(32))
    out = []
    for entry in entries:
        if entry["backend"] == "fs" and entry.get("direct_io", True):
            out.append({**entry, "name": f"{entry['name']}-encrypted",
                        "url": f"{entry['url']}-encrypted", "encrypt": f"file:{key}"})
        elif entry["backend"] == "object":
            out.append({**entry, "name": f"{entry['name']}-encrypted",
                        "prefix": f"{entry['prefix']}-encrypted", "encrypt": f"file:{key}"})
    return out


class PlaintextTwin(Raw):
    """``tier`` with ``encrypt: none``, apart from it, through kvtier."""

    label = LABEL

    def __init__(self, tier: TierConfig, namespace: Namespace, local_dir: Path | None) -> None:
        # the tier's options are checked already, by declared name: kept checked
        # (with_values), so that the open does not read them again as keys a file
        # wrote, where a declared name that is also an old key would warn
        moved: dict[str, Any] = {}
        self.files: Path | None = None
        if tier.backend == "fs" and local_dir is not None:
            self.files = local_dir.parent / f"{local_dir.name}-bench-plaintext"
            moved["url"] = str(self.files)
        elif tier.backend == "object":
            moved["prefix"] = f"{tier.options.get('prefix') or ''}-bench-plaintext".strip("-")
        else:
            raise ValueError(f"no plaintext twin for a {tier.backend} tier here")
        twin = dataclasses.replace(tier, name=f"{tier.name}-plaintext",
                                   options=with_values(tier.options, **moved), encrypt="none")
        self.chain = Chain(ChainConfig((twin,), MetricsConfig(), tier.where), namespace,
                           job_workers=1)
        self.reports = ("put", "get", "get-uncached") if self.files else ("put", "get")

    def put(self, names: list[str], blocks: list[memoryview]) -> None:
        if not all(self.chain.put([bytes.fromhex(n) for n in names], blocks)):
            raise RuntimeError("the plaintext twin refused a block")

    def get(self, names: list[str], outs: list[memoryview]) -> None:
        self.chain.get([bytes.fromhex(n) for n in names], outs)  # compared by the round

    def warm_cache(self, names: list[str]) -> None:
        if self.files is not None:
            warm_page_cache(sorted(self.files.rglob("*.kvb")))

    def drop_cache(self, names: list[str]) -> None:
        if self.files is not None:
            drop_page_cache(sorted(self.files.rglob("*.kvb")))

    def clear(self, names: list[str]) -> None:
        self.chain.evict([bytes.fromhex(n) for n in names])

    def close(self) -> None:
        self.chain.close()
