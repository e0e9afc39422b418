"""Where a key space's blocks and bookkeeping live, and the scripts' common arguments.

A key space (:mod:`kvtier_redis._scripts`) is one namespace, or with
``tenants`` the pool of every namespace under the prefix; on a cluster, one
shard of either.  :class:`Space` names its keys and builds its script calls;
:func:`stats_of` turns what the ``STATS`` script answers into the tier's
figures, the per-tenant ones included.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.policies.tenancy import TenantRule, TenantRules
from kvtier.spec import ConfigError

from . import _scripts
from ._settings import Settings

__all__ = ["DEADLINE", "EVICT", "KEEP", "LEFT", "PUT", "SCRIPTS", "STATS", "TOUCH", "Space",
           "add_stats", "check_rules", "keep_answers", "left_answers", "stats_of"]

SCRIPTS = {_scripts.sha1(text): text for text in _scripts.ALL}
PUT, EVICT, TOUCH, STATS, KEEP, DEADLINE, LEFT = (_scripts.sha1(text) for text in _scripts.ALL)

Command = tuple[Any, ...]

#: Counters of the meta hash per tenant, and the figure each is reported as.
_TENANT_FIGURES = {"b:": "tenant_bytes.", "r:": "tenant_refused.", "e:": "tenant_evicted.",
                   "x:": "tenant_expired."}


def _ms(seconds: float | None) -> int:
    return 0 if seconds is None else max(1, math.ceil(seconds * 1000))


@dataclass(frozen=True)
class Space:
    """One key space's keys, and the head of arguments every script call takes."""

    keys: tuple[bytes, ...]  # sizes, meta, expiry, limits, kept, deadlines
    lru_head: bytes
    data_head: bytes
    own: bytes  # the member prefix of this namespace's blocks
    head: tuple[Any, ...]

    @classmethod
    def make(cls, settings: Settings, base: bytes, namespace: str, data_head: bytes,
             capacity: int, shards: int = 1) -> Space:
        """The space whose bookkeeping is under ``base`` (``...:pool:`` for a pool).

        ``data_head`` is what comes before the member in a data key: the
        namespace's ``...:b:``, or for a pool the prefix (the member names the
        namespace).  ``capacity`` is the space's (a shard's part on a cluster),
        and the quotas are cut to ``shards`` parts likewise.
        """
        pooled = settings.pooled
        own = f"{namespace}:b:".encode() if pooled else b""
        lru_head = base + (b"lru:" if pooled else b"lru")
        rules = _per_shard(settings.tenants, shards).canonical() if pooled else ""
        expire = settings.expire
        head = (data_head, lru_head, b"1" if pooled else b"0", settings.tenant, own, capacity,
                rules, _ms(expire.after), _ms(expire.unused))
        keys = (base + b"size", base + b"meta", base + b"exp", base + b"limit", base + b"kept",
                base + b"deadline")
        return cls(keys, lru_head, data_head, own, head)

    def member(self, key: bytes) -> bytes:
        return self.own + key

    def data_key(self, key: bytes) -> bytes:
        return self.data_head + self.own + key

    def call(self, sha: str, args: Sequence[Any] = ()) -> Command:
        return ("EVALSHA", sha, len(self.keys), *self.keys, *self.head, *args)

    def put(self, keys: Sequence[bytes], buffers: Sequence[Any]) -> Command:
        args: list[Any] = []
        for key, buffer in zip(keys, buffers):
            args += (self.own + key, buffer)
        return self.call(PUT, args)

    def members(self, sha: str, keys: Sequence[bytes]) -> Command:
        return self.call(sha, [self.own + key for key in keys])

    def keep(self, keys: Sequence[bytes], keep: bool) -> Command:
        """Mark ``keys`` kept, or release them (the ``KEEP`` script; :func:`keep_answers`)."""
        return self.call(KEEP, [b"1" if keep else b"0", *(self.own + key for key in keys)])

    def deadline(self, keys: Sequence[bytes], after: float) -> Command:
        """Give ``keys`` a deadline ``after`` seconds from now (the ``DEADLINE`` script;
        :func:`keep_answers` reads its answers too)."""
        return self.call(DEADLINE, [max(1, round(after * 1000)),
                                    *(self.own + key for key in keys)])

    def deadlines(self, keys: Sequence[bytes]) -> Command:
        """The deadlines left of ``keys`` (the ``LEFT`` script; :func:`left_answers`)."""
        return self.members(LEFT, keys)

    def refused(self, tenant: str, count: int) -> Command:
        """Count ``count`` blocks refused before any script saw them (over the size limit)."""
        return ("HINCRBY", self.keys[1], f"r:{tenant}", count)

    def rules_check(self, rules: str) -> list[Command]:
        """Record ``rules`` for the pool unless some are; then read what is recorded."""
        return [("HSETNX", self.keys[1], "rules", rules), ("HGET", self.keys[1], "rules")]


def _per_shard(rules: TenantRules, shards: int) -> TenantRules:
    """Each quota and retention budget cut to ``shards`` parts (at least 1 byte)."""
    if shards == 1:
        return rules
    return TenantRules({
        t: TenantRule(quota=None if r.quota is None else max(1, r.quota // shards),
                      weight=r.weight, keep=r.keep // shards)
        for t, r in rules.named.items()
    })


def keep_answers(answer: Any, count: int) -> list[bool | None] | None:
    """What ``kvtier_keep`` answers for ``count`` members from the ``KEEP`` script's
    1 / 0 / -1 each; None for a reply of another shape (never a guess)."""
    if not isinstance(answer, list) or len(answer) != count:
        return None
    return [None if flag == -1 else flag == 1 for flag in answer]


def left_answers(answer: Any, count: int) -> list[float | None] | None:
    """What ``kvtier_deadlines`` answers for ``count`` members from the ``LEFT`` script's
    milliseconds left (above 0) or -1 each; None for a reply of another shape."""
    if not isinstance(answer, list) or len(answer) != count or any(
            type(ms) is not int or not (ms > 0 or ms == -1) for ms in answer):
        return None
    return [None if ms == -1 else ms / 1000 for ms in answer]


def stats_of(answer: Any, tenant: str) -> dict[str, int]:
    """The figures of one space from its ``STATS`` answer, ``{HGETALL meta, blocks, kept
    blocks}``; ``kept_bytes`` and ``keep_refused`` are ``tenant``'s, as host's and fs's."""
    pairs, blocks, kept = answer
    meta = {bytes(k).decode(errors="replace"): v for k, v in zip(pairs[0::2], pairs[1::2])}
    out = {"used_bytes": int(meta.get("used", 0)), "blocks": int(blocks),
           "evictions": int(meta.get("evictions", 0)), "kept_blocks": int(kept),
           "kept_bytes": int(meta.get(f"k:{tenant}", 0)),
           "keep_refused": int(meta.get(f"kr:{tenant}", 0))}
    for field, value in meta.items():
        figure = _TENANT_FIGURES.get(field[:2])
        if figure is not None and field[2:]:
            out[figure + field[2:]] = int(value)
    return out


def add_stats(total: dict[str, int], more: Mapping[str, int]) -> None:
    """Add one shard's figures to ``total``."""
    for name, value in more.items():
        total[name] = total.get(name, 0) + value


def check_rules(wanted: str, stored: Any, where: str) -> None:
    """A ConfigError naming both where the pool was opened with other ``tenants`` rules."""
    recorded = stored.decode() if isinstance(stored, bytes) else str(stored)
    if recorded != wanted:
        raise ConfigError(
            f"{where}: the pool's tenants rules are {recorded}, this process's are {wanted}: "
            "every process sharing a prefix must give the same rules (to change them, stop "
            "them all and delete the 'rules' field of <prefix>:pool:meta)", key="tenants")
