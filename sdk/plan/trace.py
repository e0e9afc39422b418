"""Traces for ``kvtier plan``: Mooncake JSONL, kvtier's recorded traffic, and generated ones.

A trace is a list of :class:`Request` (:mod:`.requests`, which the readers
here and in :mod:`.vllm_events` share): the block keys of one prompt, in
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
is read by :func:`kvtier.plan.vllm_events.events_trace`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from .requests import BLOCK_TOKENS, Request, Trace
from .vllm_events import events_trace

__all__ = ["BLOCK_TOKENS", "Request", "Trace", "generate", "read_trace", "write_mooncake"]

#: Recorded keys are 64-bit hashes; a sample keeps those below its share of this space.
_HASH_SPACE = 1 << 64
#: Fields of a Mooncake-style line that name its conversation (the sticky router's key).
SESSION_FIELDS = ("session_id", "conversation_id")


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number plan reads")


def _integers(values: Any, what: str) -> tuple[int, ...]:
    """Block hashes: a list of integers (a float, even a whole one, is refused, not cut)."""
    if not isinstance(values, list):
        raise ValueError(f"{what} needs a list of integer block hashes")
    for value in values:
        if type(value) is not int:
            raise ValueError(f"{what} holds integer block hashes, got {json.dumps(value)}")
    return tuple(values)


def _mooncake_request(row: dict[str, Any], block_tokens: int) -> Request:
    keys = _integers(row.get("hash_ids"), "a Mooncake line's hash_ids")
    session = next((row[name] for name in SESSION_FIELDS if row.get(name) is not None), None)
    session = None if session is None else str(session)
    length = row.get("input_length")
    if length is not None and (type(length) is not int or length < 0):
        raise ValueError(f"input_length is a count of tokens, got {json.dumps(length)}")
    if not length:
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
                row = json.loads(line, parse_constant=_no_constant)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc.msg}") from None
            except (ValueError, RecursionError) as exc:
                raise ValueError(f"{path}:{number}: {exc}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object")
            yield number, row


def read_trace(path: str | Path, block_tokens: int = BLOCK_TOKENS) -> Trace:
    """Read a Mooncake JSONL trace or a kvtier recording (told apart by its header).

    Raises ``ValueError`` naming the file and line of anything it cannot read.
    """
    path = Path(path)
    try:
        return _read(path, block_tokens)
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None


def _read(path: Path, block_tokens: int) -> Trace:
    rows = _lines(path)
    first = next(rows, None)
    if first is None:
        return Trace([], block_tokens, source=str(path))
    if "kvtier_trace" in first[1]:
        return _recorded(path, [first, *rows], block_tokens)
    if "kvtier_events" in first[1]:
        try:
            return events_trace(rows, str(path))
        except ValueError as exc:
            raise ValueError(f"{path}:{exc}") from None
    requests = []
    for number, row in [first, *rows]:
        try:
            requests.append(_mooncake_request(row, block_tokens))
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
    return Trace(requests, block_tokens, source=str(path))


def _header(head: dict[str, Any], block_tokens: int) -> tuple[float, int]:
    """A recording header's sample and tokens per block (0 or none: ``block_tokens``)."""
    sample, tokens = head.get("sample", 1.0), head.get("block_tokens")
    if type(sample) not in (int, float) or not 0 < sample <= 1:
        raise ValueError(f"a recording's sample is a share above 0 and at most 1, "
                         f"got {json.dumps(sample)}")
    if tokens is not None and (type(tokens) is not int or tokens < 0):
        raise ValueError(f"a recording's block_tokens is a count of tokens, "
                         f"got {json.dumps(tokens)}")
    return float(sample), tokens or block_tokens


def _recorded(path: Path, rows: Iterable[tuple[int, dict[str, Any]]],
              block_tokens: int) -> Trace:
    """A recording, each run appended to the file read with its own header.

    Runs recorded at different samples are read at the lowest: sampling keeps
    a call whose first key falls below the sample of the hash space, so the
    calls of a higher sample that a lower one keeps are the ones it would
    have kept.
    """
    by_op: dict[str, list[Request]] = {"lookup": [], "get": [], "put": []}
    tokens, first_header = block_tokens, 0
    samples: set[float] = set()
    for number, row in rows:
        try:
            if "kvtier_trace" in row:  # the header of this run (a restart appends one)
                sample, run_tokens = _header(row, block_tokens)
                if first_header and run_tokens != tokens:
                    raise ValueError(f"this run's blocks hold {run_tokens} tokens, "
                                     f"the first run's (line {first_header}) {tokens}: "
                                     "plan one at a time")
                tokens, first_header = run_tokens, first_header or number
                samples.add(sample)
                continue
            op = row.get("op")
            if op not in by_op:
                raise ValueError("a recorded line needs an op: lookup, get or put")
            keys = _integers(row.get("keys"), "a recorded line's keys")
        except ValueError as exc:
            raise ValueError(f"{path}:{number}: {exc}") from None
        by_op[op].append(Request(keys, (tokens,) * len(keys)))
    requests = by_op["lookup"] or by_op["get"] or by_op["put"]
    lowest = min(samples, default=1.0)
    if len(samples) > 1:
        limit = int(lowest * _HASH_SPACE)  # as kvtier.chain.record keeps a call
        requests = [r for r in requests if r.keys and r.keys[0] < limit]
    return Trace(requests, tokens, sample=lowest, source=str(path))


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
