"""What operators' commands do to a chain's stores: list, verify, delete.

``kvtier inspect``, ``kvtier scrub`` and ``kvtier purge`` (their command
line is :mod:`kvtier.cli.operate_commands`) work on the stores a chain file names,
outside any engine, through the contract alone: ``kvtier_scan`` lists what a
store holds (every namespace of it), ``kvtier_get`` reads blocks and
``kvtier_evict`` removes them, each through an instance opened on the
block's own namespace.  Namespaces are described from the store's catalog
(:mod:`kvtier.chain.catalog`); blocks are checked with the block format's own
checks (:mod:`kvtier.block.framing`).

A tier that is neither persistent nor shared (RAM) holds blocks only inside
the process that runs the chain, so these commands skip it and say why.

They look at stores that exist and create none: a backend that declares the
boolean option :data:`CREATE_OPTION` is opened with it off, so that a
mistyped location is an error naming it, not a new, empty store.  A look
(``inspect``, ``scrub`` without ``--repair``) also writes nothing: a backend
that declares :data:`READ_ONLY_OPTION` is opened with it on, so that a
read-only mount can be looked at and a root is left as it was.  An option
a backend refuses when opened is an error of the command too; a tier that
cannot be opened for another reason (a server down, a damaged index, a
read-only mount under a purge) is :attr:`OperatorStore.failed`, which the
commands report and exit non-zero for: what they did not check is no success.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtier.block.crypt import Keyring
from kvtier.block.framing import CODEC_ZSTD, decode_into, parse_header
from kvtier.block.framing import check_payload as _check_payload
from kvtier.block.namespace import Namespace
from kvtier.chain.catalog import CATALOG_HEX, open_catalog, read_descriptors
from kvtier.chain.cost import LoadCost
from kvtier.chain.tier import Tier
from kvtier.config.chain_config import ChainConfig, TierConfig
from kvtier.plugins.options import with_values
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import ConfigError, CorruptBlockError, ScanEntry

__all__ = [
    "CREATE_OPTION",
    "READ_ONLY_OPTION",
    "Corrupt",
    "NamespaceSummary",
    "OperatorStore",
    "check_block",
    "inspect_store",
    "open_stores",
    "purge_plan",
    "remove",
    "scrub_store",
    "still_held",
    "tenant_keeping",
    "tenant_totals",
]

#: Bytes of blocks read per get call while scrubbing or sampling.
READ_BATCH_BYTES = 64 << 20
#: Keys per evict call.
EVICT_BATCH = 1000
#: A backend option (``bool``) saying whether opening may create the store's location.
CREATE_OPTION = "create"
#: A backend option (``bool``) saying that the store is opened to be read, writing nothing.
READ_ONLY_OPTION = "read_only"


def as_found(config: TierConfig, registry: BackendRegistry, read_only: bool = False
             ) -> TierConfig:
    """``config`` with :data:`CREATE_OPTION` off, and :data:`READ_ONLY_OPTION` on if
    ``read_only``, where its backend declares them."""
    declared = registry.options(config.backend)
    wanted = {CREATE_OPTION: False, **({READ_ONLY_OPTION: True} if read_only else {})}
    set_ = {k: v for k, v in wanted.items()
            if (opt := declared.get(k)) is not None and opt.type == "bool"}
    if not set_:
        return config
    return dataclasses.replace(config, options=with_values(config.options, **set_))


class OperatorStore:
    """One tier's store, opened for operators: a lister, plus an instance per namespace.

    ``skipped`` says why a tier holds nothing these commands can see (RAM, a
    backend that cannot list); ``failed`` why a store could not be opened.
    """

    def __init__(self, config: TierConfig, registry: BackendRegistry,
                 read_only: bool = False) -> None:
        config = as_found(config, registry, read_only)
        self.config = config
        self.name = config.name
        self._registry = registry
        self._tiers: dict[str, Tier] = {}
        self.skipped: str | None = None
        self.failed: str | None = None
        self.lister: Tier | None = None
        try:
            self.lister = open_catalog(config, registry)
        except ConfigError:
            raise  # a mistyped or missing location: the command cannot do what was asked
        except Exception as exc:
            self.failed = f"cannot open: {exc}"
            return
        caps = self.lister.capabilities
        if not (caps.persistent or caps.shared):
            self.skipped = "holds blocks only in the memory of the process running the chain"
        elif not self.lister.handle.implements("kvtier_scan"):
            self.skipped = (f"backend {config.backend!r} does not implement kvtier_scan "
                            "(contract 1.1)")

    def entries(self) -> list[ScanEntry]:
        """Every block of the store, each key once per namespace."""
        assert self.lister is not None
        seen: set[tuple[str, bytes]] = set()
        out: list[ScanEntry] = []
        for batch in self.lister.scan(None):
            for entry in batch:
                if (entry.namespace, entry.key) not in seen:
                    seen.add((entry.namespace, entry.key))
                    out.append(entry)
        return out

    def tier(self, namespace: str) -> Tier:
        """An instance opened on ``namespace`` (kept until :meth:`close`)."""
        tier = self._tiers.get(namespace)
        if tier is None:
            tier = Tier(self.config, self._registry.create(self.config.backend),
                        Namespace.from_hex(namespace))
            tier.open()
            self._tiers[namespace] = tier
        return tier

    def descriptors(self, namespaces: set[str]) -> dict[str, dict[str, Any]]:
        assert self.lister is not None
        return read_descriptors(self.lister, namespaces)

    def close(self) -> None:
        for tier in [*self._tiers.values(), *([self.lister] if self.lister else [])]:
            with contextlib.suppress(Exception):  # one failing must not keep others open
                tier.close()
        self._tiers.clear()


def open_stores(config: ChainConfig, registry: BackendRegistry,
                only: Sequence[str] = (), read_only: bool = False) -> list[OperatorStore]:
    """The chain's stores (only the tiers named in ``only``, if given), top to bottom;
    with ``read_only``, opened to be looked at (see :data:`READ_ONLY_OPTION`)."""
    names = [t.name for t in config.tiers]
    unknown = [n for n in only if n not in names]
    if unknown:
        raise ConfigError(f"no tier named {unknown[0]!r} in {config.source} "
                          f"(tiers: {', '.join(names)})", key="--tier")
    stores: list[OperatorStore] = []
    try:
        for tier in config.tiers:
            if not only or tier.name in only:
                stores.append(OperatorStore(tier, registry, read_only))
        named = [s for s in stores if (s.skipped or s.failed) and s.name in only]
        if named:
            raise ConfigError(f"tier {named[0].name!r}: {named[0].skipped or named[0].failed}",
                              key="--tier")
    except BaseException:
        for store in stores:
            store.close()
        raise
    return stores


def _read_batches(entries: Sequence[ScanEntry]) -> Iterator[list[ScanEntry]]:
    """Runs of entries of one namespace, about :data:`READ_BATCH_BYTES` each."""
    by_ns: dict[str, list[ScanEntry]] = {}
    for entry in entries:
        by_ns.setdefault(entry.namespace, []).append(entry)
    for group in by_ns.values():
        batch: list[ScanEntry] = []
        total = 0
        for entry in group:
            if batch and total + entry.size > READ_BATCH_BYTES:
                yield batch
                batch, total = [], 0
            batch.append(entry)
            total += entry.size
        if batch:
            yield batch


def check_block(
    blob: Any, entry: ScanEntry, seal: Keyring | None = None
) -> tuple[int, str | None]:
    """Verify one stored block fully; ``(codec, None)`` or ``(-1, reason)``.

    Header, namespace, key, length and checksum, and for a compressed block
    the zstd frame itself (decoded into scratch memory).  A sealed block is
    opened with ``seal``, the tier's keys (its tag is its checksum); without
    them only its header is checked: a configuration that lost its
    ``encrypt`` must not have a scrub remove every sealed block.
    """
    fingerprint = bytes.fromhex(entry.namespace)
    try:
        header = parse_header(blob, fingerprint, entry.key)
        if header.key_id and seal is None:
            return header.codec, None
        stored = memoryview(blob).cast("B")[header.size :]
        _check_payload(header, stored, True, seal)
        if header.codec == CODEC_ZSTD:
            decode_into(blob, fingerprint, entry.key, memoryview(bytearray(header.raw_len)),
                        verify=False, seal=seal)
    except CorruptBlockError as exc:
        return -1, str(exc)
    return header.codec, None


# -------------------------------------------------------------------------
# inspect
# -------------------------------------------------------------------------


@dataclass
class NamespaceSummary:
    namespace: str
    description: dict[str, Any] | None
    blocks: int = 0
    bytes: int = 0
    oldest: float | None = None
    newest: float | None = None
    sampled: int = 0
    codecs: Counter[str] = field(default_factory=Counter)
    #: Expected time to load a usual block, fitted from the sample's reads (0: none read).
    block_load_s: float = 0.0
    #: Whose blocks these are: the tenant their headers name (each tenant is a namespace
    #: of its own), else the descriptor's where no header was read; None: unknown.
    tenant: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "description": self.description,
                "tenant": self.tenant,
                "blocks": self.blocks, "bytes": self.bytes, "oldest": self.oldest,
                "newest": self.newest, "sampled": self.sampled, "codecs": dict(self.codecs),
                "block_load_s": self.block_load_s}


#: The store's per-tenant keep figures, from its backend's stats (the ``fs`` pool's).
_KEEPING = {"tenant_kept_bytes.": "kept_bytes", "tenant_keep_refused.": "keep_refused"}


def tenant_keeping(store: OperatorStore) -> dict[str, dict[str, int]] | None:
    """Per tenant, the bytes the store keeps marked and the marks it refused, where its
    backend counts every tenant's (``tenant_kept_bytes.<t>``, ...: the ``fs`` pool with
    ``tenants``; a tenant it names not has none); None where it counts none."""
    if store.lister is None:
        return None
    try:
        stats = store.lister.handle.stats()
    except Exception:  # figures are a bonus: a store that cannot give them gives none
        return None
    if "catalog_bytes" not in stats:  # no count of tenants: nothing to say of their marks
        return None
    out: dict[str, dict[str, int]] = {}
    for key, value in stats.items():
        for prefix, figure in _KEEPING.items():
            if key.startswith(prefix) and isinstance(value, int):
                out.setdefault(key[len(prefix):], {})[figure] = value
    return out


def tenant_totals(summaries: Sequence[NamespaceSummary],
                  keeping: Mapping[str, Mapping[str, int]] | None = None
                  ) -> list[dict[str, Any]]:
    """Per tenant (most bytes first): its blocks, bytes and namespaces in the store, and
    its ``kept_bytes`` and ``keep_refused`` from ``keeping`` (None: not counted)."""
    totals: dict[str | None, dict[str, Any]] = {}
    for s in summaries:
        reported = None if keeping is None else keeping.get(s.tenant or "", {})
        marks = {f: None if reported is None else reported.get(f, 0)
                 for f in ("kept_bytes", "keep_refused")}
        into = totals.setdefault(s.tenant, {"tenant": s.tenant, "blocks": 0, "bytes": 0,
                                            "namespaces": 0, **marks})
        into["blocks"] += s.blocks
        into["bytes"] += s.bytes
        into["namespaces"] += 1
    return sorted(totals.values(), key=lambda t: (-t["bytes"], t["tenant"] or ""))


_CODEC_NAMES = {0: "none", 1: "zstd", -1: "corrupt"}


def inspect_store(store: OperatorStore, sample: int) -> tuple[list[NamespaceSummary], int]:
    """Per namespace: blocks, bytes, age range, codec mix of up to ``sample`` headers,
    and the tenant those headers name.

    Also answers how many namespace descriptors the catalog holds.
    """
    entries = store.entries()
    summaries: dict[str, NamespaceSummary] = {}
    catalog = 0
    for entry in entries:
        if entry.namespace == CATALOG_HEX:
            catalog += 1
            continue
        s = summaries.get(entry.namespace)
        if s is None:
            s = summaries[entry.namespace] = NamespaceSummary(entry.namespace, None)
        s.blocks += 1
        s.bytes += entry.size
        if entry.mtime is not None:
            s.oldest = entry.mtime if s.oldest is None else min(s.oldest, entry.mtime)
            s.newest = entry.mtime if s.newest is None else max(s.newest, entry.mtime)
    for ns, fields in store.descriptors(set(summaries)).items():
        summaries[ns].description = fields
    picked: list[ScanEntry] = []
    taken: Counter[str] = Counter()
    for entry in entries:
        if entry.namespace in summaries and taken[entry.namespace] < sample:
            taken[entry.namespace] += 1
            picked.append(entry)
    costs: dict[str, LoadCost] = {}  # the chain's cost model, fed with the sample's reads
    for batch in _read_batches(picked):
        start = time.perf_counter()
        blobs = store.tier(batch[0].namespace).handle.get([e.key for e in batch])
        read = [len(b) for b in blobs if b is not None]
        costs.setdefault(batch[0].namespace, LoadCost(3600.0)).observe(
            len(read), sum(read), time.perf_counter() - start)
        summary = summaries[batch[0].namespace]
        for entry, blob in zip(batch, blobs):
            if blob is None:
                continue  # evicted since the scan
            codec, _ = check_block(blob, entry, store.tier(batch[0].namespace).seal)
            summary.sampled += 1
            summary.codecs[_CODEC_NAMES.get(codec, str(codec))] += 1
            if codec >= 0 and summary.tenant is None:  # a sound block's header names it
                header = parse_header(blob, bytes.fromhex(entry.namespace), entry.key)
                summary.tenant = header.tenant.decode("utf-8", "replace") or None
    for ns, cost in costs.items():
        summaries[ns].block_load_s = cost.predict(1)
    for summary in summaries.values():
        if summary.tenant is None and summary.description:
            tenant = summary.description.get("tenant")
            summary.tenant = tenant if isinstance(tenant, str) else None
    ordered = sorted(summaries.values(), key=lambda s: (-s.bytes, s.namespace))
    return ordered, catalog


# -------------------------------------------------------------------------
# scrub
# -------------------------------------------------------------------------


@dataclass(frozen=True)
class Corrupt:
    namespace: str
    key: bytes
    size: int
    reason: str
    removed: bool

    def as_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "key": self.key.hex(), "size": self.size,
                "reason": self.reason, "removed": self.removed}


@dataclass
class ScrubResult:
    checked: int = 0
    bytes: int = 0
    vanished: int = 0
    corrupt: list[Corrupt] = field(default_factory=list)
    # still held but not readable (a fault of the block, such as EACCES or EIO)
    unreadable: list[ScanEntry] = field(default_factory=list)


class RateLimit:
    """Sleeps so that work goes no faster than ``per_second`` units on average."""

    def __init__(self, per_second: float | None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.per_second, self._sleep = per_second, sleep
        self._start = time.monotonic()
        self._done = 0.0

    def spent(self, amount: float) -> None:
        if not self.per_second:
            return
        self._done += amount
        ahead = self._done / self.per_second - (time.monotonic() - self._start)
        if ahead > 0:
            self._sleep(ahead)


def scrub_store(store: OperatorStore, entries: Sequence[ScanEntry], *, repair: bool,
                limit: RateLimit, progress: Callable[[int], None]) -> ScrubResult:
    """Read and check every block in ``entries``; remove the bad ones if ``repair``.

    ``progress`` is told the bytes of each batch checked.  Blocks gone since
    the scan are counted as vanished, not corrupt; a block the store still
    holds but cannot read (a fault of that block, which the backend answers
    as a miss) is listed as unreadable, and the scrub goes on.
    """
    result = ScrubResult()
    for batch in _read_batches(entries):
        tier = store.tier(batch[0].namespace)
        blobs = tier.handle.get([e.key for e in batch])
        bad: list[tuple[ScanEntry, str]] = []
        missing = [e for e, blob in zip(batch, blobs) if blob is None]
        held = tier.handle.lookup([e.key for e in missing]) if missing else []
        for entry, still in zip(missing, held):
            if still:
                result.unreadable.append(entry)
            else:
                result.vanished += 1
        for entry, blob in zip(batch, blobs):
            if blob is None:
                continue
            result.checked += 1
            result.bytes += memoryview(blob).nbytes
            _, reason = check_block(blob, entry, tier.seal)
            if reason is not None:
                bad.append((entry, reason))
        removed = tier.handle.evict([e.key for e, _ in bad]) if repair and bad else []
        for i, (entry, reason) in enumerate(bad):
            result.corrupt.append(Corrupt(entry.namespace, entry.key, entry.size, reason,
                                          bool(removed[i]) if removed else False))
        size = sum(e.size for e in batch)
        progress(size)
        limit.spent(size)
    return result


# -------------------------------------------------------------------------
# purge
# -------------------------------------------------------------------------


def purge_plan(store: OperatorStore, *, model: str | None, namespace: str | None,
               older_than: float | None, now: float
               ) -> tuple[list[ScanEntry], int, dict[str, Any], dict[str, int]]:
    """The blocks the selectors match (all given ones must match), and what was left out.

    Answers the matching entries, how many blocks ``older_than`` could not
    judge (the store keeps no time for them), the descriptors of the
    namespaces seen, and the blocks per namespace that ``model`` could not
    judge: the other selectors match them, but their namespace has no
    descriptor.  The catalog is never matched: its descriptors go with
    their namespace when a purge takes the whole namespace (see :func:`remove`).
    """
    entries = [e for e in store.entries() if e.namespace != CATALOG_HEX]
    descriptors = store.descriptors({e.namespace for e in entries})
    cutoff = None if older_than is None else now - older_than
    matched: list[ScanEntry] = []
    undated = 0
    undescribed: Counter[str] = Counter()
    for entry in entries:
        if namespace is not None and entry.namespace != namespace:
            continue
        if model is not None and entry.namespace not in descriptors:
            undescribed[entry.namespace] += 1  # its model is unknown: perhaps this one
            continue
        if model is not None and (descriptors.get(entry.namespace) or {}).get("model") != model:
            continue
        if cutoff is not None:
            if entry.mtime is None:
                undated += 1
                continue
            if entry.mtime >= cutoff:
                continue
        matched.append(entry)
    return matched, undated, descriptors, dict(undescribed)


def still_held(store: OperatorStore, entries: Sequence[ScanEntry]) -> list[ScanEntry]:
    """Those of ``entries`` the store still holds (after a purge: not removed)."""
    held: list[ScanEntry] = []
    for ns, group in _by_namespace(entries).items():
        tier = store.tier(ns)
        for start in range(0, len(group), EVICT_BATCH):
            part = group[start : start + EVICT_BATCH]
            flags = tier.handle.lookup([e.key for e in part])
            held += [e for e, f in zip(part, flags) if f]
    return held


def _by_namespace(entries: Sequence[ScanEntry]) -> dict[str, list[ScanEntry]]:
    by_ns: dict[str, list[ScanEntry]] = {}
    for entry in entries:
        by_ns.setdefault(entry.namespace, []).append(entry)
    return by_ns


def remove(store: OperatorStore, entries: Sequence[ScanEntry],
           whole_namespaces: bool) -> tuple[int, int]:
    """Evict ``entries``; answers (blocks removed, bytes freed).

    With ``whole_namespaces`` (no age selector) the namespaces' descriptors
    are removed from the catalog too.
    """
    removed = freed = 0
    by_ns = _by_namespace(entries)
    for ns, group in by_ns.items():
        tier = store.tier(ns)
        for start in range(0, len(group), EVICT_BATCH):
            part = group[start : start + EVICT_BATCH]
            flags = tier.handle.evict([e.key for e in part])
            removed += sum(1 for f in flags if f)
            freed += sum(e.size for e, f in zip(part, flags) if f)
    if whole_namespaces and store.lister is not None and by_ns:
        store.lister.handle.evict([bytes.fromhex(ns) for ns in by_ns])
    return removed, freed
