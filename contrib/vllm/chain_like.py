"""What the vLLM tier asks of a chain, and the stand-in it serves from while none is open.

:class:`ChainLike` names the :class:`kvtier.chain.Chain` methods that
:class:`~kvtier.contrib.vllm.tier.KvtierTier` calls through its ``chain``
attribute.  That attribute holds either a real chain or an
:class:`UnopenedChain` (while the storage was unreachable at start-up), so
mypy checks both against this one protocol, and a change to the chain's
signatures that the stand-in does not follow is a type error here, not a
failure in the one test that starts vLLM without its storage.  (The tier
calls ``lookup`` and ``add_listener`` only on a real :class:`~kvtier.chain.Chain`.)
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol

from kvtier.chain import JobResult

__all__ = ["ChainLike", "UnopenedChain"]


class ChainLike(Protocol):
    """The chain methods the vLLM tier calls (see :class:`kvtier.chain.Chain` for each)."""

    def submit_lookup(self, keys: Sequence[bytes]) -> int: ...

    def submit_put(
        self, keys: Sequence[bytes], blocks: Sequence[memoryview], *, held: bool = False
    ) -> int: ...

    def submit_get(self, keys: Sequence[bytes], out: Sequence[memoryview]) -> int: ...

    def put(self, keys: Sequence[bytes], blocks: Sequence[memoryview]) -> list[bool]: ...

    def evict(self, keys: Sequence[bytes]) -> int: ...

    def poll(self) -> list[JobResult]: ...

    def wait(self, job_ids: Iterable[int] | None = None, timeout: float | None = None) -> bool: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class UnopenedChain:
    """Stands in for a chain that could not be opened: holds nothing, takes nothing.

    Jobs finish as they are submitted (ids are negative, never a real chain's).
    """

    def __init__(self, error: str) -> None:
        self.error = error
        self.tiers: list[Any] = []
        self._ids = itertools.count(-1, -1)
        self._done: list[JobResult] = []

    def _job(self, kind: Literal["put", "get", "lookup"], result: list[Any]) -> int:
        job_id = next(self._ids)
        self._done.append(JobResult(job_id, kind, result))
        return job_id

    def submit_lookup(self, keys: Sequence[bytes]) -> int:
        return self._job("lookup", [None] * len(keys))

    def submit_put(
        self, keys: Sequence[bytes], blocks: Sequence[Any], *, held: bool = False
    ) -> int:
        return self._job("put", [False] * len(keys))

    def submit_get(self, keys: Sequence[bytes], out: Sequence[Any]) -> int:
        return self._job("get", [False] * len(keys))

    def put(self, keys: Sequence[bytes], blocks: Sequence[Any]) -> list[bool]:
        return [False] * len(keys)

    def evict(self, keys: Sequence[bytes]) -> int:
        return 0

    def poll(self) -> list[JobResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: Iterable[int] | None = None, timeout: float | None = None) -> bool:
        return True

    def stats(self) -> dict[str, Any]:
        return {"namespace": "", "tiers": [], "pending_writes": 0, "unavailable": self.error}

    def close(self) -> None:
        return None
