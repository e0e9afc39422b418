"""vLLM's ``kv_hints`` as kvtier retention: the hint action ``kvtier.keep``.

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
go.  Marks are made on a thread of their own once the tenant's submitted
stores are done, never on vLLM's scheduler thread.  Other actions are
ignored (docs/tenants.md, "Keep").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

__all__ = ["KEEP_ACTION", "KEEP_VERSION", "Keeper", "keeps"]

log = logging.getLogger("kvtier.vllm")

KEEP_ACTION = "kvtier.keep"
KEEP_VERSION = "1"
#: The longest a mark waits for the tenant's submitted stores.
_WAIT_S = 60.0


@dataclass(frozen=True)
class RequestKeep:
    """Whether a request's hints ask that its blocks be kept, kept in its ``ReqContext``."""

    keep: bool


def keeps(req_context: Any) -> bool:
    """Whether ``req_context``'s ``kv_hints`` hold a ``kvtier.keep`` action of version 1;
    decided once per request."""
    get_state = getattr(req_context, "get_state", None)
    known = get_state(RequestKeep) if get_state is not None else None
    if isinstance(known, RequestKeep):
        return known.keep
    actions = getattr(getattr(req_context, "kv_hints", None), "actions", None) or ()
    keep = any(getattr(a, "action_type", None) == KEEP_ACTION
               and getattr(a, "action_version", None) == KEEP_VERSION for a in actions)
    set_state = getattr(req_context, "set_state", None)
    if set_state is not None:
        set_state(RequestKeep(keep))
    return keep


class Keeper:
    """Marks blocks kept in their tenant's chain, on one thread of its own."""

    def __init__(self, chain_of: Callable[[str], Any], gate: AbstractContextManager[Any]) -> None:
        self._chain_of = chain_of
        self._gate = gate  # the tier's lock: held while a store is being submitted
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvtier-vllm-keep")
        self.kept = self.refused = 0  # blocks marked, and refused (the tenant's budget)

    def submit(self, tenant: str, keys: Sequence[bytes]) -> None:
        """Mark ``keys`` (chain keys) of ``tenant`` once its submitted stores are done."""
        self._pool.submit(self._keep, tenant, list(keys))

    def _keep(self, tenant: str, keys: list[bytes]) -> None:
        with self._gate:  # the store that asked for the mark is submitted by now
            pass
        try:
            chain = self._chain_of(tenant)
            if chain is None or not hasattr(chain, "keep"):
                return
            chain.wait(timeout=_WAIT_S)  # the stores submitted before: their blocks held
            answers = chain.keep(keys)
            self.kept += sum(answers)
            self.refused += len(answers) - sum(answers)
        except Exception as exc:  # a mark is a hint: it never fails a request
            log.warning("kvtier: keeping %d blocks of tenant %r failed: %r",
                        len(keys), tenant, exc)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
