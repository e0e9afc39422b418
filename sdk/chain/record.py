"""Recording a chain's traffic (``record:`` in its YAML) as a trace ``kvtier plan`` reads.

Each lookup, get and put call the chain serves is one JSON line,
``{"t": SECONDS, "op": "lookup"|"get"|"put", "keys": [HASH, ...]}``, after a
header line ``{"kvtier_trace": 1, "sample": RATE, "block_tokens": N}``.  A key
is written as its xxh3-64 hash: the trace never holds payloads or keys.

Sampling is spatial, as in SHARDS (Waldspurger et al., FAST 2015): a call is
kept when the hash of its first key falls below ``sample`` of the hash space.
An engine's prompt starts with the same block whenever it shares a prefix,
so a kept prompt keeps its later visits and their reuse; a plan of the
sampled trace reads capacities as ``1/sample`` times larger.  The file is
appended to (a restart adds a header line, which readers skip) and written
a line at a time; a write that fails stops the recording with one warning,
and the chain goes on serving.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import IO

import xxhash

from kvtier.config.record import RecordConfig
from kvtier.spec import ConfigError

__all__ = ["Recorder"]

log = logging.getLogger("kvtier")
_HASH_SPACE = 1 << 64


class Recorder:
    """Writes a chain's calls to its trace file; does nothing without a ``record`` config."""

    def __init__(self, config: RecordConfig | None, tokens_per_block: int) -> None:
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._limit = _HASH_SPACE
        self._start = time.monotonic()
        if config is None:
            return
        self._limit = int(config.sample * _HASH_SPACE)
        try:
            self._file = open(config.path, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
        except OSError as exc:
            raise ConfigError(f"cannot open the trace file: {exc}", key="record.path") from None
        header = {"kvtier_trace": 1, "sample": config.sample, "block_tokens": tokens_per_block,
                  "started": round(time.time(), 3)}
        self._write(json.dumps(header))

    def __call__(self, op: str, keys: Sequence[bytes]) -> None:
        """Note one call of ``op`` on ``keys`` (a no-op when not recording or not sampled)."""
        if self._file is None or not keys:
            return
        hash_key = xxhash.xxh3_64_intdigest
        first = hash_key(keys[0])
        if first >= self._limit:
            return
        hashes = [first, *(hash_key(key) for key in keys[1:])]
        line = {"t": round(time.monotonic() - self._start, 6), "op": op, "keys": hashes}
        self._write(json.dumps(line, separators=(",", ":")))

    def _write(self, line: str) -> None:
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.write(line + "\n")
            except (OSError, ValueError) as exc:
                log.warning("kvtier: recording the trace stopped: %s", exc)
                self._close_locked()

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _close_locked(self) -> None:
        if self._file is not None:
            file, self._file = self._file, None
            with contextlib.suppress(OSError):
                file.close()
