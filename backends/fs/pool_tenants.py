"""Tenants in the shared pool (:mod:`kvtier.backends.fs.pool`): each tenant's bytes, counted
for every process on the root, its quota, and its fair share of a full pool.

Each tenant is a namespace of its own (several, one per model), so the pool
counts a tenant's bytes as the sum of its namespaces' totals (room in flight
included) and keeps, in the index, which tenant each namespace is
(``tenants``).  That comes from the block headers (format 3 names the tenant)
when the pool counts a namespace's files, at open or in an index rebuilt from
the files, else from the opener's ``tenant`` option.  The rules of
:mod:`kvtier.policies.tenancy` decide; nothing here restates them:

- a put beyond its tenant's quota evicts that tenant's own blocks first, in
  the pool's eviction order (:meth:`PoolTenants.pick`);
- a full pool gives up the next victims of :meth:`TenantRules.victim`'s
  tenant, in the pool's order, one choice per share exceeded;
- a block larger than its quota, or one whose tenant has nothing of its own to
  evict, is refused and counted per tenant (``tenant_refused.<tenant>``).

Every process on a root must use the same rules: the first records them
(``meta``), and one asking for others is refused while a live one holds the
root open, as for another capacity (:func:`~.pool_policy.prepare`).

The catalog namespace (:data:`~.pool_policy.CATALOG_NS`, the descriptors every
chain records of its namespaces, whatever its tenant) is the pool's own, as
its index is: in the capacity, in no tenant's bytes, quota or share, and
reported apart (``catalog_bytes``).  Counted as the ``default`` tenant's, which
the catalog's namespace names, every tenant's chain opened on the root took
room from that tenant's quota, and evicted its blocks when it was full.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kvtier.block.framing import MAGIC, parse_header
from kvtier.block.namespace import DEFAULT_TENANT
from kvtier.policies.tenancy import TenantRules
from kvtier.spec import ConfigError, CorruptBlockError

from .pool_policy import CATALOG_NS
from .pool_writers import alive

if TYPE_CHECKING:
    from .local import LocalStore
    from .pool_policy import PoolPolicy, Row

__all__ = ["PoolTenants"]

_SCHEMA = "CREATE TABLE IF NOT EXISTS tenants(ns TEXT PRIMARY KEY, tenant TEXT NOT NULL)"
_HEAD = 4096  # a block's prefix and header fit in it (framing's _MAX_HEADER is 512)
_RULES = "tenants"  # the meta row of the root's rules
# per tenant, in meta as '<what>:<tenant>' (keep_refused: .pool_keep's)
_COUNTS = ("refused", "evicted", "keep_refused")
_NO_CATALOG = f"x.scope NOT IN ('*', '{CATALOG_NS}')"  # the tenants' namespaces' totals


class PoolTenants:
    """One process's view of the tenants of a root: its own (``tenant``), the root's rules."""

    def __init__(self, rules: TenantRules, tenant: str) -> None:
        self.rules, self.tenant = rules, tenant
        self.active = bool(rules)  # no rules: no quota, equal weights, the pool's order alone
        # namespace -> tenant as read from the index: a namespace's fingerprint includes its
        # tenant, so the index's answer stays (this process's own learn() updates it)
        self._known: dict[str, str] = {}

    # the index ------------------------------------------------------------------
    def prepare(self, db: sqlite3.Connection, root: str, ns: str, me: str) -> None:
        """The table, the root's one set of rules (refusing others while a live process holds
        the root open), and this namespace's tenant where the index has none yet."""
        db.execute(_SCHEMA)
        mine = self.rules.canonical()
        recorded = db.execute("SELECT value FROM meta WHERE name = ?", (_RULES,)).fetchall()
        if recorded and recorded[0][0] != mine:
            holders = sorted({writer.split(":", 1)[0] for (writer,) in db.execute(
                "SELECT writer FROM writers WHERE writer != ?", (me,)) if alive(writer)}, key=int)
            if holders:
                raise ConfigError(
                    f"fs tier {root}: its shared pool has tenants {recorded[0][0]}, this process "
                    f"asks for {mine}; every process on a root must use the same tenants: "
                    "write the same rules, or close the processes holding it open (pids "
                    f"{', '.join(holders)}) and open it with the new ones", key="tenants")
        db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (_RULES, mine))
        if ns != CATALOG_NS:  # the pool's own: no tenant's
            db.execute("INSERT OR IGNORE INTO tenants VALUES (?, ?)", (ns, self.tenant))

    def learn(self, db: sqlite3.Connection, ns: str, store: LocalStore,
              keys: Sequence[bytes]) -> None:
        """Record ``ns``'s tenant as the first of ``keys``' block headers names it: an index
        rebuilt from the files counts each tenant's bytes as the one it replaced did."""
        if ns == CATALOG_NS:
            return  # its descriptors' headers name the tenant default: they are no one's
        for key in keys[:4]:  # a block unreadable, or not framed (a raw backend's), or old
            tenant = _header_tenant(store, ns, key)
            if tenant:
                db.execute("INSERT OR REPLACE INTO tenants VALUES (?, ?)", (ns, tenant))
                self._known.pop(ns, None)
                return

    def tenant_of(self, db: sqlite3.Connection, ns: str) -> str:
        """``ns``'s tenant; '' for the catalog's, which is no tenant's (nothing counts to it)."""
        if ns == CATALOG_NS:
            return ""
        known = self._known.get(ns)
        if known is not None:
            return known
        row = db.execute("SELECT tenant FROM tenants WHERE ns = ?", (ns,)).fetchall()
        if not row:
            return DEFAULT_TENANT  # not yet registered: asked again next time
        self._known[ns] = str(row[0][0])
        return self._known[ns]

    def held(self, db: sqlite3.Connection, scope: str = "*") -> dict[str, tuple[int, int]]:
        """Each tenant's bytes counted (files and room in flight) and bytes in flight, in
        ``scope`` (a namespace, or ``*``: the root)."""
        where = "" if scope == "*" else "AND x.scope = ? "
        rows = db.execute(
            "SELECT COALESCE(t.tenant, ?), SUM(x.bytes), SUM(x.inflight) FROM totals AS x "
            f"LEFT JOIN tenants AS t ON t.ns = x.scope WHERE {_NO_CATALOG} {where}"
            "GROUP BY 1", (DEFAULT_TENANT,) if scope == "*" else (DEFAULT_TENANT, scope))
        return {str(t): (int(b), int(f)) for t, b, f in rows}

    def room(self, db: sqlite3.Connection, ns: str) -> tuple[int | None, int, int]:
        """``ns``'s tenant's quota (None: none), the bytes it may still take under it, and
        its bytes in flight (writes that may land, credits that may come back)."""
        if ns == CATALOG_NS:
            return None, 0, 0  # the pool's own: bound by the capacity alone
        tenant = self.tenant_of(db, ns)
        quota = self.rules.quota(tenant) if self.active else None
        if quota is None:
            return None, 0, 0
        held, inflight = self.held(db).get(tenant, (0, 0))
        return quota, quota - held, inflight

    def namespaces(self, db: sqlite3.Connection, tenant: str, scope: str) -> list[str]:
        """``tenant``'s namespaces with totals in ``scope``."""
        known = [ns for (ns,) in db.execute(
            "SELECT x.scope FROM totals AS x LEFT JOIN tenants AS t ON t.ns = x.scope "
            f"WHERE {_NO_CATALOG} AND COALESCE(t.tenant, ?) = ?", (DEFAULT_TENANT, tenant))]
        return [ns for ns in known if scope in ("*", ns)]

    # victims -------------------------------------------------------------------
    def pick(self, db: sqlite3.Connection, policy: PoolPolicy, ns: str, capacity: int | None,
             scope: str, own: int, need: int, want: int) -> list[Row]:
        """Mark ``D`` the victims (in the evictor's transaction): ``own`` bytes of the writer's
        tenant beyond its quota, then ``need`` bytes of the scope, each from the tenant
        :meth:`TenantRules.victim` names, for a put of ``want`` bytes.  None if the
        quota's room cannot be made (the tenant has too little of its own stored)."""
        if need > 0 and policy.stored(db, evictable=True) < need:
            return []  # evicting all would not do: refused, nothing lost
        tenant = self.tenant_of(db, ns)
        victims: list[Row] = []
        if own > 0:
            mine = self.namespaces(db, tenant, "*")
            if policy.stored(db, evictable=True, among=mine, everywhere=True) < own:
                return []  # evicting all of its own would not do: refused, nothing lost
            victims = policy.choose(db, own, among=mine, everywhere=True)
            need -= sum(size for space, _, size in victims if scope in ("*", space))
        if need <= 0:
            return victims
        if capacity is None:  # the floor alone: no shares to weigh, the pool's order
            return victims + policy.choose(db, need)
        held = {t: counted for t, (counted, _) in self.held(db, scope).items()}
        for space, _, size in victims:
            held[self.tenant_of(db, space)] = held.get(self.tenant_of(db, space), 0) - size
        if ns == CATALOG_NS:  # the pool's own put: the tenant most beyond its share gives
            holding = sorted(t for t, n in held.items() if n > 0)
            if not holding:
                return victims + policy.choose(db, need)
            tenant = self.rules.victim(held, capacity, holding[0], 0)
        empty: set[str] = set()  # tenants found with nothing evictable
        while need > 0:
            live = {t: n for t, n in held.items() if t not in empty}
            if not live and tenant in empty:
                break
            victim = self.rules.victim(live, capacity, tenant, want)
            if victim in empty:
                break
            shares = self.rules.shares({t for t, n in live.items() if n > 0} | {tenant},
                                       capacity)
            beyond = live.get(victim, 0) + (want if victim == tenant else 0) - shares[victim]
            got = policy.choose(db, max(1, min(need, beyond)),
                                among=self.namespaces(db, victim, scope))
            freed = sum(size for *_, size in got)
            victims += got
            if not freed:  # nothing of its own to give: the next tenant most beyond
                empty.add(victim)
                held[victim] = 0
                continue
            held[victim] = held.get(victim, 0) - freed
            need -= freed
        return victims

    # figures -------------------------------------------------------------------
    def count(self, db: sqlite3.Connection, what: str, counts: Mapping[str, int]) -> None:
        """Add ``counts`` (tenant -> blocks) to the root's ``what`` (refused, evicted); the
        catalog's ('') count to no tenant."""
        db.executemany("INSERT INTO meta VALUES (?, ?) ON CONFLICT (name) "
                       "DO UPDATE SET value = value + excluded.value",
                       [(f"{what}:{t}", n) for t, n in counts.items() if n and t])

    def evicted(self, db: sqlite3.Connection, namespaces: Sequence[str]) -> None:
        """Victims of ``namespaces`` deleted: counted per tenant (the catalog's to none)."""
        counts: dict[str, int] = {}
        for ns in namespaces:
            tenant = self.tenant_of(db, ns)
            counts[tenant] = counts.get(tenant, 0) + 1
        self.count(db, "evicted", counts)

    def figures(self, db: sqlite3.Connection) -> dict[str, int]:
        """``tenant_bytes.<t>`` (counted: files and room in flight), ``tenant_kept_bytes.<t>``,
        ``tenant_refused.<t>``, ``tenant_evicted.<t>`` and ``tenant_keep_refused.<t>``
        (blocks, every process of the root), and ``catalog_bytes``: one pass over each
        table, whatever the number of tenants."""
        out = {f"tenant_bytes.{t}": counted for t, (counted, _) in self.held(db).items()}
        # the descriptors of every tenant's namespaces: the pool's own, counted apart
        catalog = db.execute("SELECT bytes FROM totals WHERE scope = ?", (CATALOG_NS,)).fetchall()
        out["catalog_bytes"] = int(catalog[0][0]) if catalog else 0
        for tenant, kept in db.execute(
                "SELECT COALESCE(t.tenant, ?), SUM(b.size) FROM kept AS k JOIN blocks AS b "
                "ON b.ns = k.ns AND b.key = k.key LEFT JOIN tenants AS t ON t.ns = k.ns "
                "WHERE b.state = 'S' AND k.ns != ? GROUP BY 1", (DEFAULT_TENANT, CATALOG_NS)):
            out[f"tenant_kept_bytes.{tenant}"] = int(kept)
        for name, value in db.execute("SELECT name, value FROM meta WHERE name GLOB '*:*'"):
            what, _, tenant = str(name).partition(":")
            if what in _COUNTS:
                out[f"tenant_{what}.{tenant}"] = int(value)
        return out


def _header_tenant(store: LocalStore, ns: str, key: bytes) -> str:
    """The tenant a block's header names; '' for a block unreadable, unframed or older.
    Its first 4 KiB hold the header of a plain block; a compressed one is read whole
    (its header is checked against its frame)."""
    try:
        with open(store.path(key), "rb") as f:
            head = f.read(_HEAD)
            if not head.startswith(MAGIC):
                return ""  # no block of kvtier's format: not read further
            try:
                header = parse_header(head, bytes.fromhex(ns), key)
            except CorruptBlockError:
                header = parse_header(head + f.read(), bytes.fromhex(ns), key)
    except (OSError, CorruptBlockError):
        return ""
    return header.tenant.decode("utf-8", "replace")
