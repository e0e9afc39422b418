"""What a trace is: a list of requests, the one thing every reader of ``kvtier plan`` returns.

Kept apart from the readers (:mod:`.trace` for Mooncake JSONL, recordings and
generated traffic; :mod:`.vllm_events` for vLLM's KV-event logs) so that each of
them imports it, and :mod:`.trace` imports :mod:`.vllm_events` without a cycle.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BLOCK_TOKENS", "Request", "Trace"]

#: Tokens per block in the Mooncake traces.
BLOCK_TOKENS = 512


@dataclass(frozen=True)
class Request:
    """One prompt: its block keys in order, the prompt tokens each block holds, its session."""

    keys: tuple[int, ...]
    tokens: tuple[int, ...]
    session: str | None = None  # a conversation's id, where the trace names one


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order; ``sample`` is the fraction of traffic a recording kept."""

    requests: list[Request]
    block_tokens: int = BLOCK_TOKENS
    sample: float = 1.0
    source: str = ""

    @property
    def references(self) -> int:
        return sum(len(r.keys) for r in self.requests)

    @property
    def unique_blocks(self) -> int:
        return len({key for r in self.requests for key in r.keys})
