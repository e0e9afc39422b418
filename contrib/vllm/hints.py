"""vLLM's ``kv_hints`` as kvtier retention: the hint actions ``kvtier.keep`` and
``kvtier.expire``.

vLLM 0.32 hands a tier each request's ``kv_hints`` (``ReqContext.kv_hints``):
a ``KvHintsEnvelope`` of versioned ``KvHintAction``\\ s, each an
``action_type``, an ``action_version`` and a JSON ``payload``, whose meaning
is the receiving component's.  Only callers of vLLM's Python API send them
(``AsyncLLM.generate(..., kv_hints=...)``), not HTTP clients of ``vllm
serve``, so they come from the operator's own code.

kvtier reads one action: ``action_type`` ``"kvtier.keep"``, ``action_version``
``"1"`` (payload ignored).  The blocks a request with it stores, and those it
would store that the tier already holds, are marked kept in its tenant's chain
(:meth:`Chain.keep <kvtier.chain.Chain.keep>`), within the tenant's ``keep``
budget: a system prompt sent with the hint stays while other prompts come and
go.

A second, ``action_type`` ``"kvtier.expire"``, ``action_version`` ``"1"``,
gives the same blocks a deadline (:meth:`Chain.expire
<kvtier.chain.Chain.expire>`): its payload is ``{"after": D}``, ``D`` a number
of seconds above 0 or a duration such as ``"10m"``.  The blocks expire then,
or by their tier's own ``expire``, whichever is first (a one-off prompt's
blocks leave sooner, never later).  A payload that is not such a mapping is
ignored, with one log line per request, never an error for the engine; of
several such actions, the earliest deadline holds.

Marks and deadlines are made on a thread of their own once the tenant's
submitted stores are done, never on vLLM's scheduler thread.  Other actions
are ignored (docs/tenants.md, "Keep" and "Expiry").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from kvtier.chain.expiring import deadline_seconds

__all__ = ["EXPIRE_ACTION", "EXPIRE_VERSION", "KEEP_ACTION", "KEEP_VERSION", "Keeper",
           "RequestHints", "keeps", "retention"]

log = logging.getLogger("kvtier.vllm")

KEEP_ACTION = "kvtier.keep"
KEEP_VERSION = "1"
EXPIRE_ACTION = "kvtier.expire"
EXPIRE_VERSION = "1"
#: The longest a mark waits for the tenant's submitted stores.
_WAIT_S = 60.0


@dataclass(frozen=True)
class RequestHints:
    """What a request's hints ask of its blocks, kept in its ``ReqContext``: kept, and a
    deadline in seconds (None: none).  False where they ask nothing."""

    keep: bool = False
    expire_after: float | None = None

    def __bool__(self) -> bool:
        return self.keep or self.expire_after is not None


#: The hints of a request that gives none.
NO_HINTS = RequestHints()


def retention(req_context: Any) -> RequestHints:
    """What ``req_context``'s ``kv_hints`` ask: ``kvtier.keep`` and ``kvtier.expire``
    actions of version 1; decided once per request."""
    get_state = getattr(req_context, "get_state", None)
    known = get_state(RequestHints) if get_state is not None else None
    if isinstance(known, RequestHints):
        return known
    actions = getattr(getattr(req_context, "kv_hints", None), "actions", None) or ()
    keep, after = False, None
    for action in actions:
        kind = (getattr(action, "action_type", None), getattr(action, "action_version", None))
        if kind == (KEEP_ACTION, KEEP_VERSION):
            keep = True
        elif kind == (EXPIRE_ACTION, EXPIRE_VERSION):
            seconds = _deadline(getattr(action, "payload", None), req_context)
            if seconds is not None:
                after = seconds if after is None else min(after, seconds)
    hints = RequestHints(keep, after) if keep or after is not None else NO_HINTS
    set_state = getattr(req_context, "set_state", None)
    if set_state is not None:
        set_state(hints)
    return hints


def keeps(req_context: Any) -> bool:
    """Whether ``req_context``'s ``kv_hints`` hold a ``kvtier.keep`` action of version 1."""
    return retention(req_context).keep


def _deadline(payload: Any, req_context: Any) -> float | None:
    """The seconds of a ``kvtier.expire`` payload ``{"after": D}``; None, and one log
    line, for anything else."""
    try:
        if not isinstance(payload, Mapping) or set(payload) != {"after"}:
            raise ValueError('expected {"after": seconds or a duration such as "10m"}')
        return deadline_seconds(payload["after"])
    except ValueError as exc:
        log.warning("kvtier: request %s: kv_hints action %s ignored: payload %.200r: %s",
                    getattr(req_context, "req_id", "?"), EXPIRE_ACTION, payload, exc)
        return None


class Keeper:
    """Marks blocks kept, and gives them deadlines, in their tenant's chain, on one
    thread of its own."""

    def __init__(self, chain_of: Callable[[str], Any], gate: AbstractContextManager[Any]) -> None:
        self._chain_of = chain_of
        self._gate = gate  # the tier's lock: held while a store is being submitted
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvtier-vllm-keep")
        self.kept = self.refused = 0  # blocks marked, and refused (the tenant's budget)
        self.expiring = 0  # blocks given a deadline at every tier that holds them

    def submit(self, tenant: str, keys: Sequence[bytes],
               hints: RequestHints = RequestHints(keep=True)) -> None:
        """Mark ``keys`` (chain keys) of ``tenant`` and give them the deadline ``hints``
        ask, once its submitted stores are done."""
        self._pool.submit(self._apply, tenant, list(keys), hints)

    def _apply(self, tenant: str, keys: list[bytes], hints: RequestHints) -> None:
        with self._gate:  # the store that asked for the mark is submitted by now
            pass
        try:
            chain = self._chain_of(tenant)
            if chain is None or not hasattr(chain, "keep"):
                return
            chain.wait(timeout=_WAIT_S)  # the stores submitted before: their blocks held
            if hints.keep:
                answers = chain.keep(keys)
                self.kept += sum(answers)
                self.refused += len(answers) - sum(answers)
            if hints.expire_after is not None:
                self.expiring += sum(chain.expire(keys, hints.expire_after))
        except Exception as exc:  # a hint never fails a request
            log.warning("kvtier: applying %s to %d blocks of tenant %r failed: %r",
                        hints, len(keys), tenant, exc)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
