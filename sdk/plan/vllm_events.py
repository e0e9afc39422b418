"""vLLM's KV-cache events: recorded from its publisher, read back as a trace for ``kvtier plan``.

vLLM with ``kv_events_config`` (``enable_kv_cache_events``, publisher
``zmq``) publishes each engine step's events on a ZeroMQ PUB socket: frames
``(topic, 8-byte big-endian sequence number, msgpack payload)``, the payload
``[ts, [event, ...], data_parallel_rank]`` with each event a map tagged by
``type``: ``BlockStored`` (``block_hashes``, ``parent_block_hash``,
``token_ids``, ``block_size``, ``medium``, ``group_idx``, ``session_id``,
...), ``BlockRemoved`` (``block_hashes``, ``medium``) or ``AllBlocksCleared``.

:func:`record_events` subscribes and writes JSONL, read with ``json`` only:
a header ``{"kvtier_events": 1, "endpoint": ..., "topic": ...}``, then one
line per batch ``{"t": TS, "seq": N, "rank": R, "events": [...]}`` with the
events' own field names, except that ``token_ids`` (the prompt's text) is
replaced by ``tokens``, their count, and ``extra_keys`` and LoRA fields are
dropped: the log holds block hashes, never prompts.  A hash vLLM sends as
bytes is written as the integer vLLM's int mode makes of it (big-endian, low
64 bits).  What cannot be decoded is skipped and counted, never evaluated.

:func:`events_trace` turns the ``BlockStored`` events of one medium (``GPU``
by default: the blocks the engine computed) into requests.  A request is a
chain of blocks: an event whose ``parent_block_hash`` is the last block of a
request read so far continues it (a later prefill chunk, or blocks its
output filled); any other event starts a request, whose blocks are the
event's after its ancestors (followed through the parents of blocks stored
earlier in the log).  What this can and cannot see is in docs/sizing.md.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import msgpack

from .requests import Request, Trace

__all__ = ["RecordError", "RecordStats", "decode_batch", "events_trace", "record_events"]

_MASK = (1 << 64) - 1
#: vLLM's replay socket ends its answer with this sequence number.
_END_SEQ = (-1).to_bytes(8, "big", signed=True)
_KEEP = {"BlockStored": ("parent_block_hash", "block_size", "medium", "group_idx", "session_id"),
         "BlockRemoved": ("medium", "group_idx"), "AllBlocksCleared": ()}


def _hash(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value & _MASK
    if isinstance(value, bytes):
        return int.from_bytes(value, "big") & _MASK
    return None


def _event(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict) or raw.get("type") not in _KEEP:
        return None
    kind = raw["type"]
    out: dict[str, Any] = {"type": kind}
    if kind != "AllBlocksCleared":
        if not isinstance(raw.get("block_hashes"), list):
            return None
        hashes = [_hash(h) for h in raw["block_hashes"]]
        if None in hashes:
            return None
        out["block_hashes"] = hashes
    for name in _KEEP[kind]:
        value = raw.get(name)
        if name == "parent_block_hash":
            value = None if value is None else _hash(value)
        elif name == "block_size" and not (isinstance(value, int) and value > 0):
            return None
        elif value is not None and not isinstance(value, (str, int)):
            value = None
        out[name] = value
    if kind == "BlockStored":
        tokens = raw.get("token_ids")
        out["tokens"] = len(tokens) if isinstance(tokens, list) else None
    return out


def decode_batch(payload: bytes, seq: int) -> tuple[dict[str, Any] | None, int]:
    """One published batch as a log line, and how many of its events were skipped."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException):
        return None, 0
    if not (isinstance(raw, list) and len(raw) >= 2 and isinstance(raw[0], (int, float))
            and isinstance(raw[1], list)):
        return None, 0
    events = [_event(e) for e in raw[1]]
    kept = [e for e in events if e is not None]
    rank = raw[2] if len(raw) > 2 and isinstance(raw[2], int) else None
    return {"t": float(raw[0]), "seq": seq, "rank": rank, "events": kept}, len(events) - len(kept)


class RecordError(ValueError):
    """An endpoint the recorder cannot connect to or bind, or a log it cannot open."""


@dataclass
class RecordStats:
    batches: int = 0
    events: int = 0
    skipped: int = 0  # events or batches that could not be decoded
    missed: int = 0  # batches the sequence numbers say never arrived


def _write(out: IO[str], stats: RecordStats, seq_frame: bytes, payload: bytes,
           last: int | None) -> int | None:
    seq = int.from_bytes(seq_frame, "big", signed=True) if len(seq_frame) == 8 else -1
    if last is not None and seq <= last:
        return last  # already written (replayed, then published live)
    line, skipped = decode_batch(payload, seq)
    stats.skipped += skipped
    if line is None:
        stats.skipped += 1
        return last
    if last is not None and seq > last + 1:
        stats.missed += seq - last - 1
    out.write(json.dumps(line) + "\n")
    out.flush()
    stats.batches += 1
    stats.events += len(line["events"])
    return seq


def record_events(
    endpoint: str, path: str | Path, *, topic: str = "", replay: str | None = None,
    bind: bool = False, batches: int | None = None, seconds: float | None = None,
) -> RecordStats:
    """Append vLLM's event batches from ``endpoint`` to ``path`` until ``batches`` or ``seconds``.

    ``replay``: vLLM's replay endpoint, asked first for every batch it still
    buffers.  ``bind``: bind ``endpoint`` (vLLM set to connect) instead of
    connecting to it.  Stops on KeyboardInterrupt too.
    """
    import zmq  # pyzmq: installed with vLLM

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        (sub.bind if bind else sub.connect)(endpoint)
    except (zmq.ZMQError, UnicodeError) as exc:
        sub.close(linger=0)
        raise RecordError(f"--endpoint {endpoint}: {exc}") from None
    stats = RecordStats()
    deadline = None if seconds is None else time.monotonic() + seconds
    last: int | None = None
    try:
        try:
            log = Path(path).open("a", encoding="utf-8")  # noqa: SIM115 (closed by the with)
        except OSError as exc:
            raise RecordError(f"--out {path}: {exc.strerror or exc}") from None
        with log as out:
            out.write(json.dumps({"kvtier_events": 1, "endpoint": endpoint, "topic": topic})
                      + "\n")
            if replay:
                dealer = ctx.socket(zmq.DEALER)
                try:
                    dealer.connect(replay)
                except zmq.ZMQError as exc:
                    dealer.close(linger=0)
                    raise RecordError(f"--replay-endpoint {replay}: {exc}") from None
                dealer.send_multipart([b"", (0).to_bytes(8, "big")])
                while dealer.poll(5000):
                    frames = dealer.recv_multipart()
                    if len(frames) != 4 or frames[2] == _END_SEQ:
                        break
                    last = _write(out, stats, frames[2], frames[3], last)
                dealer.close(linger=0)
            while batches is None or stats.batches < batches:
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if not sub.poll(100):
                    continue
                frames = sub.recv_multipart()
                if len(frames) == 3:
                    last = _write(out, stats, frames[1], frames[2], last)
                else:
                    stats.skipped += 1
    except KeyboardInterrupt:
        pass
    finally:
        sub.close(linger=0)
    return stats


def _ancestors(parent: int | None, parent_of: dict[int, int | None]) -> list[int]:
    """``parent`` and the blocks before it, first block first, as far as the log knows."""
    chain: list[int] = []
    seen: set[int] = set()
    while parent is not None and parent not in seen:  # a cycle: a hash collision
        seen.add(parent)
        chain.append(parent)
        parent = parent_of.get(parent)
    return chain[::-1]


def _stored(number: int, row: dict[str, Any], medium: str) -> Iterable[dict[str, Any]]:
    """The ``BlockStored`` events of ``medium`` on a log line, checked."""
    events = row.get("events")
    if not isinstance(events, list):
        raise ValueError(f"{number}: an event line needs an events list")
    for event in events:
        if not isinstance(event, dict) or event.get("type") != "BlockStored":
            continue
        if event.get("medium") not in (medium, None) or event.get("group_idx") not in (0, None):
            continue  # a hybrid model's other KV groups repeat the same requests
        hashes, parent = event.get("block_hashes"), event.get("parent_block_hash")
        if not (isinstance(hashes, list) and all(type(h) is int for h in hashes)
                and (parent is None or type(parent) is int)
                and type(event.get("block_size")) is int and event["block_size"] > 0):
            raise ValueError(f"{number}: a BlockStored event needs integer block_hashes, "
                             "parent_block_hash and block_size")
        if hashes:
            yield event


def events_trace(rows: Iterable[tuple[int, dict[str, Any]]], source: str = "",
                 medium: str = "GPU") -> Trace:
    """The requests the ``BlockStored`` events of ``medium`` make, from numbered log lines."""
    parent_of: dict[int, int | None] = {}
    tails: dict[int, int] = {}  # a request's last block -> the request
    keys: list[list[int]] = []
    sessions: list[str | None] = []
    block_tokens = 0
    for number, row in rows:
        if "kvtier_events" in row:
            continue  # the header of a later recording appended to the file
        for event in _stored(number, row, medium):
            hashes: list[int] = event["block_hashes"]
            parent: int | None = event.get("parent_block_hash")
            block_tokens = block_tokens or event["block_size"]
            index = tails.pop(parent, None) if parent is not None else None
            if index is None:
                index = len(keys)
                keys.append(_ancestors(parent, parent_of))
                session = event.get("session_id")
                sessions.append(None if session is None else str(session))
            keys[index].extend(hashes)
            for h in hashes:
                parent_of.setdefault(h, parent)
                parent = h
            tails[hashes[-1]] = index
    block_tokens = block_tokens or 16
    requests = [Request(tuple(k), (block_tokens,) * len(k), s)
                for k, s in zip(keys, sessions, strict=True)]
    return Trace(requests, block_tokens, source=source)
