"""One chain's batch API over the chains of many tenants, for engines that mix them.

An engine adapter sees keys of many requests at once (a scheduler step's
lookups, a completion thread's finished jobs), and each request may be of
another tenant.  :class:`TenantRouter` takes *tenant-qualified* keys
(:func:`qualify`: the tenant's name, a NUL, the key), splits every batch by
tenant, hands each part to that tenant's chain, and answers for the batch as
one job, in the order given.  So an adapter written against one chain keeps
its bookkeeping (verdicts, pins, jobs) keyed by qualified keys and job ids,
and every block still goes to its tenant's namespace (docs/tenants.md).

``fallback`` (optional) names, for a qualified key, another one to read when
the first misses: a tenant reading a shared tenant's blocks (a system prompt
under LMCache).  Lookups and gets try it for the keys their tenant's chain
misses; puts and evictions never touch it, so no tenant writes or removes
what it only reads.

A tenant's chain comes from ``chain_of(tenant)`` (:meth:`Tenants.chain
<kvtier.chain.tenants.Tenants.chain>`, or the adapter's own chain for its
default tenant).  One that fails to open is a miss, for the keys of that
tenant only, logged, and tried again after ``retry_after`` seconds; the
other tenants are served.  The router owns no chain: the caller closes them.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from kvtier.chain.jobs import JobResult

__all__ = ["TenantRouter", "qualify", "unqualify"]

log = logging.getLogger("kvtier.tenants")

_SEP = b"\x00"


def qualify(tenant: str, key: bytes) -> bytes:
    """``key`` of ``tenant``, as :class:`TenantRouter` takes it (a tenant name has no NUL)."""
    return tenant.encode() + _SEP + key


def unqualify(qualified: bytes) -> tuple[str, bytes]:
    """The tenant and the key of a qualified key."""
    tenant, _, key = qualified.partition(_SEP)
    return tenant.decode(), key


@dataclass
class _Merge:
    """A job over several tenants' chains: the parts' results, in the caller's order."""

    kind: Literal["put", "get", "lookup"]
    result: list[Any]
    keys: Sequence[bytes] = ()
    out: Sequence[Any] = ()
    parts: int = 0
    error: BaseException | None = None
    subs: list[tuple[Any, int]] = field(default_factory=list)


class TenantRouter:
    """Batches of qualified keys, each part on its tenant's chain.  Thread-safe."""

    def __init__(
        self, chain_of: Callable[[str], Any], *, retry_after: float = 30.0,
        fallback: Callable[[bytes], bytes | None] | None = None,
    ) -> None:
        self._chain_of = chain_of
        self._fallback = fallback
        self._retry_after = retry_after
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._jobs: dict[int, _Merge] = {}
        # (the tenant's chain, its job id) -> (our job id, the positions of its keys,
        # whether its keys are fallbacks)
        self._subs: dict[tuple[Any, int], tuple[int, list[int], bool]] = {}
        self._done: list[JobResult] = []
        self._failed: dict[str, float] = {}  # tenant -> when to try its chain again

    def chain(self, tenant: str) -> Any:
        """``tenant``'s chain, or None while it fails to open (logged once a try)."""
        now = time.monotonic()
        if self._failed.get(tenant, 0.0) > now:
            return None
        try:
            chain = self._chain_of(tenant)
        except Exception as exc:  # its storage is down, say: only this tenant's keys miss
            self._failed[tenant] = now + self._retry_after
            log.warning("kvtier: the chain of tenant %r did not open (%r); its keys are "
                        "misses, tried again in %.0fs", tenant, exc, self._retry_after)
            return None
        self._failed.pop(tenant, None)
        return chain

    def _groups(self, keys: Sequence[bytes]) -> dict[str, tuple[list[int], list[bytes]]]:
        groups: dict[str, tuple[list[int], list[bytes]]] = {}
        for i, qualified in enumerate(keys):
            tenant, key = unqualify(qualified)
            positions, raw = groups.setdefault(tenant, ([], []))
            positions.append(i)
            raw.append(key)
        return groups

    def _submit(
        self, kind: Literal["put", "get", "lookup"], keys: Sequence[bytes],
        start: Callable[[Any, list[int], list[bytes]], int], missing: Any,
    ) -> int:
        merge = _Merge(kind, [missing] * len(keys), keys)
        with self._lock:  # whole: no part is polled before every part is counted
            job_id = next(self._ids)
            try:
                self._start(job_id, merge, keys, range(len(keys)), start, False)
            except BaseException:  # a chain closing: the parts started are forgotten
                for sub_key in merge.subs:
                    self._subs.pop(sub_key, None)
                raise
            if merge.parts:
                self._jobs[job_id] = merge
            else:  # nothing reached a chain: done now, every key a miss
                self._done.append(JobResult(job_id, kind, merge.result))
        return job_id

    def _start(
        self, job_id: int, merge: _Merge, keys: Sequence[bytes], where: Sequence[int],
        start: Callable[[Any, list[int], list[bytes]], int], fallback: bool,
    ) -> None:
        """Start a part per tenant of ``keys`` (at positions ``where`` of the job)."""
        for tenant, (positions, raw) in self._groups(keys).items():
            chain = self.chain(tenant)
            if chain is None:
                continue
            positions = [where[i] for i in positions]
            sub = start(chain, positions, raw)  # mistakes in the arguments raise here
            merge.parts += 1
            self._subs[(chain, sub)] = (job_id, positions, fallback)
            merge.subs.append((chain, sub))

    def _read_fallbacks(self, job_id: int, merge: _Merge, missed: list[int]) -> None:
        """Try the fallback keys of a read's ``missed`` positions (under the lock)."""
        assert self._fallback is not None
        where = [(i, other) for i in missed if (other := self._fallback(merge.keys[i]))]
        if not where:
            return
        def start(c: Any, pos: list[int], raw: list[bytes]) -> int:
            if merge.kind == "lookup":
                return int(c.submit_lookup(raw))
            return int(c.submit_get(raw, [merge.out[i] for i in pos]))
        try:
            self._start(job_id, merge, [k for _, k in where], [i for i, _ in where], start, True)
        except Exception as exc:  # a chain closing: those keys stay misses
            log.debug("kvtier: fallback reads not started: %r", exc)

    def submit_lookup(self, keys: Sequence[bytes]) -> int:
        """:meth:`Chain.submit_lookup <kvtier.Chain.submit_lookup>` over qualified keys."""
        return self._submit("lookup", keys, lambda c, _, raw: c.submit_lookup(raw), None)

    def submit_put(
        self, keys: Sequence[bytes], blocks: Sequence[Any], *, held: bool = False
    ) -> int:
        """:meth:`Chain.submit_put <kvtier.Chain.submit_put>` over qualified keys."""
        return self._submit("put", keys, lambda c, pos, raw: c.submit_put(
            raw, [blocks[i] for i in pos], held=held), False)

    def submit_get(self, keys: Sequence[bytes], out: Sequence[Any]) -> int:
        """:meth:`Chain.submit_get <kvtier.Chain.submit_get>` over qualified keys."""
        job_id = self._submit("get", keys, lambda c, pos, raw: c.submit_get(
            raw, [out[i] for i in pos]), False)
        with self._lock:
            merge = self._jobs.get(job_id)
            if merge is not None:
                merge.out = out
        return job_id

    def _each(self, keys: Sequence[bytes], call: Callable[[Any, list[int], list[bytes]],
                                                          list[Any]], missing: Any) -> list[Any]:
        result = [missing] * len(keys)
        for tenant, (positions, raw) in self._groups(keys).items():
            chain = self.chain(tenant)
            if chain is not None:
                for i, value in zip(positions, call(chain, positions, raw)):
                    result[i] = value
        return result

    def get_bytes(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """:meth:`Chain.get_bytes <kvtier.Chain.get_bytes>` over qualified keys, with fallbacks."""
        got = self._each(keys, lambda c, _, raw: c.get_bytes(raw), None)
        if self._fallback is not None:
            again = [(i, other) for i, value in enumerate(got)
                     if value is None and (other := self._fallback(keys[i]))]
            for (i, _), value in zip(again, self._each([k for _, k in again],
                                                       lambda c, _, raw: c.get_bytes(raw), None)):
                got[i] = value
        return got

    def put(self, keys: Sequence[bytes], blocks: Sequence[Any]) -> list[bool]:
        """:meth:`Chain.put <kvtier.Chain.put>` over qualified keys."""
        return self._each(keys, lambda c, pos, raw: c.put(raw, [blocks[i] for i in pos]), False)

    def evict_each(self, keys: Sequence[bytes]) -> list[bool]:
        """:meth:`Chain.evict_each <kvtier.Chain.evict_each>` over qualified keys."""
        return self._each(keys, lambda c, _, raw: c.evict_each(raw), False)

    def evict(self, keys: Sequence[bytes]) -> int:
        """:meth:`Chain.evict <kvtier.Chain.evict>` over qualified keys: how many were held."""
        counts = self._each(keys, lambda c, _, raw: [c.evict(raw)] + [0] * (len(raw) - 1), 0)
        return sum(counts)

    def poll(self) -> list[JobResult]:
        """Jobs finished since the last call, each once, each whole."""
        with self._lock:
            chains = list(dict.fromkeys(chain for chain, _ in self._subs))
            done, self._done = self._done, []
        for chain in chains:
            for res in chain.poll():
                with self._lock:
                    entry = self._subs.pop((chain, res.job_id), None)
                    if entry is None:
                        continue
                    job_id, positions, was_fallback = entry
                    merge = self._jobs[job_id]  # registered before the lock was let go
                    if res.error is not None:
                        merge.error = merge.error or res.error
                    else:
                        for i, value in zip(positions, res.result):
                            merge.result[i] = value
                        # a miss: None (lookup) or False (get); a lookup's hit may be 0
                        missed = [i for i in positions
                                  if merge.result[i] is None or merge.result[i] is False]
                        if (missed and not was_fallback and self._fallback is not None
                                and merge.kind != "put"):
                            self._read_fallbacks(job_id, merge, missed)
                    merge.parts -= 1
                    if merge.parts == 0:
                        del self._jobs[job_id]
                        result = [] if merge.error is not None else merge.result
                        done.append(JobResult(job_id, merge.kind, result, merge.error))
        return done

    def wait(self, job_ids: Iterable[int] | None = None, timeout: float | None = None) -> bool:
        """Wait until the jobs (default: all) are done; False if ``timeout`` ran out first."""
        with self._lock:
            wanted = None if job_ids is None else set(job_ids)
            by_chain: dict[Any, list[int]] = {}
            for (chain, sub), (job_id, _, _) in self._subs.items():
                if wanted is None or job_id in wanted:
                    by_chain.setdefault(chain, []).append(sub)
        deadline = None if timeout is None else time.monotonic() + timeout
        for chain, subs in by_chain.items():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not chain.wait(subs, left):
                return False
        return True
