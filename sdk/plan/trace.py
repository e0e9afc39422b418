"""Traces for ``kvtier plan``: Mooncake JSONL, kvtier's recorded traffic, and generated ones.

A trace is a list of :class:`Request`: the block keys of one prompt, in
order, with the prompt tokens each block carries.  Both file formats are one
JSON object a line, read with ``json`` only (nothing in them is executed):

* Mooncake (``FAST25-release/traces`` in kvcache-ai/Mooncake): ``timestamp``,
  ``input_length``, ``output_length``, ``hash_ids`` of 512-token blocks.  The
  last block of a prompt carries what is left of ``input_length``.  A
  ``session_id`` or ``conversation_id``, where a line has one, is kept for
  the fleet's sticky router.
* kvtier's recording (``record:`` in a chain, see kvtier.chain.record): a
  header line ``{"kvtier_trace": 1, "sample": RATE, ...}``, then one line per
  call, ``{"t": SECONDS, "op": "lookup"|"get"|"put", "keys": [HASH, ...]}``.
  Each lookup is an engine asking for its prompt's cached prefix, so each is
  a request; a recording without lookups (a chain driven by gets and puts
  only) uses its gets instead, and its puts where it has no gets either.

A vLLM KV-event log (``kvtier record-events``, header ``{"kvtier_events": 1}``)
is read by :func:`kvtier.plan.events.events_trace`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["BLOCK_TOKENS", "Request", "Trace", "generate", "read_trace", "write_mooncake"]

#: Tokens per block in the Mooncake traces.
BLOCK_TOKENS = 512
#: Fields of a Mooncake-style line that name its conversation (the sticky router's key).
SESSION_FIELDS = ("session_id", "conversation_id")


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


def _mooncake_request(row: dict[str, Any], block_tokens: int) -> Request:
    keys = tuple(int(h) for h in row["hash_ids"])
    session = next((row[name] for name in SESSION_FIELDS if row.get(name) is not None), None)
    session = None if session is None else str(session)
    length = row.get("input_length")
    if not isinstance(length, int) or length <= 0:
        return Request(keys, (block_tokens,) * len(keys), session)
    tokens = tuple(
        max(0, min(block_tokens, length - i * block_tokens)) for i in range(len(keys))
    )
    return Request(keys, tokens, session)


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object")
            yield number, row


def read_trace(path: str | Path, block_tokens: int = BLOCK_TOKENS) -> Trace:
    """Read a Mooncake JSONL trace or a kvtier recording (told apart by its header)."""
    path = Path(path)
    rows = _lines(path)
    first = next(rows, None)
    if first is None:
        return Trace([], block_tokens, source=str(path))
    if "kvtier_trace" in first[1]:
        return _recorded(path, first[1], rows)
    if "kvtier_events" in first[1]:
        from .events import events_trace  # it imports this module

        try:
            return events_trace(rows, str(path))
        except ValueError as exc:
            raise ValueError(f"{path}:{exc}") from None
    requests = []
    for number, row in [first, *rows]:
        if not isinstance(row.get("hash_ids"), list):
            raise ValueError(f"{path}:{number}: a Mooncake line needs a hash_ids list")
        requests.append(_mooncake_request(row, block_tokens))
    return Trace(requests, block_tokens, source=str(path))


def _recorded(
    path: Path, head: dict[str, Any], rows: Iterable[tuple[int, dict[str, Any]]]
) -> Trace:
    block_tokens = int(head.get("block_tokens") or 0) or BLOCK_TOKENS
    by_op: dict[str, list[Request]] = {"lookup": [], "get": [], "put": []}
    for number, row in rows:
        if "kvtier_trace" in row:
            continue  # the header of a later run appending to the file
        keys = row.get("keys")
        if row.get("op") not in by_op or not isinstance(keys, list):
            raise ValueError(f"{path}:{number}: a recorded line needs an op and a keys list")
        by_op[row["op"]].append(Request(tuple(int(k) for k in keys), (block_tokens,) * len(keys)))
    requests = by_op["lookup"] or by_op["get"] or by_op["put"]
    sample = float(head.get("sample", 1.0))
    return Trace(requests, block_tokens, sample=sample, source=str(path))


def write_mooncake(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` as Mooncake JSONL (one request a line, a millisecond apart)."""
    with Path(path).open("w", encoding="utf-8") as out:
        for i, request in enumerate(trace.requests):
            row: dict[str, Any] = {"timestamp": i, "input_length": sum(request.tokens),
                                   "output_length": 1, "hash_ids": list(request.keys)}
            if request.session is not None:
                row["session_id"] = request.session
            out.write(json.dumps(row) + "\n")


def generate(kind: str, requests: int, seed: int = 0, block_tokens: int = BLOCK_TOKENS) -> Trace:
    """A synthetic trace with a known reuse structure.

    ``prompts``: a few shared system prompts (Zipf-popular) before one-off
    questions.  ``sessions``: multi-turn conversations, each turn re-sending
    the whole history plus a new turn.  ``documents``: long documents asked
    about repeatedly, popularity Zipf.  ``scan``: a hot set of prefixes with
    long one-off contexts streaming through between them.
    """
    rng = random.Random(seed)
    fresh = iter(range(1 << 40, 1 << 62))  # ids never repeated by accident
    out: list[tuple[int, ...]] = []
    if kind == "prompts":
        systems = [tuple(next(fresh) for _ in range(rng.randint(2, 8))) for _ in range(20)]
        for _ in range(requests):
            system = systems[min(int(rng.paretovariate(1.2)) - 1, len(systems) - 1)]
            out.append(system + tuple(next(fresh) for _ in range(rng.randint(1, 6))))
    elif kind == "sessions":
        live: list[tuple[int, ...]] = []
        for _ in range(requests):
            if not live or rng.random() < 0.25:
                live.append(tuple(next(fresh) for _ in range(rng.randint(1, 4))))
                if len(live) > 64:
                    live.pop(rng.randrange(len(live)))
            i = rng.randrange(len(live))
            live[i] = live[i] + tuple(next(fresh) for _ in range(rng.randint(1, 3)))
            out.append(live[i])
    elif kind == "documents":
        docs = [tuple(next(fresh) for _ in range(rng.randint(8, 40))) for _ in range(200)]
        for _ in range(requests):
            doc = docs[min(int(rng.paretovariate(0.9)) - 1, len(docs) - 1)]
            out.append((*doc, next(fresh)))
    elif kind == "scan":
        hot = [tuple(next(fresh) for _ in range(4)) for _ in range(10)]
        for _ in range(requests):
            if rng.random() < 0.5:
                out.append((*rng.choice(hot), next(fresh)))
            else:
                out.append(tuple(next(fresh) for _ in range(rng.randint(10, 30))))
    else:
        raise ValueError(f"unknown trace kind {kind!r}: prompts, sessions, documents or scan")
    return Trace([Request(keys, (block_tokens,) * len(keys)) for keys in out], block_tokens,
                 source=f"generated:{kind}:{requests}:{seed}")
