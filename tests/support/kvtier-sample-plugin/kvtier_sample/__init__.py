"""A minimal kvtier backend, plus deliberately malformed ones for the loader's checks."""

from __future__ import annotations

import os
import time
from pathlib import Path

from kvtier.spec import Capabilities, ClosedError, Option, hookimpl


class SampleBackend:
    """Blocks in a dict, with a prefix option to prove options arrive."""

    def __init__(self) -> None:
        self.blocks: dict[bytes, bytes] = {}
        self.closed = False
        self.prefix = b""

    @hookimpl
    def kvtier_options(self):
        return {"prefix": Option("str", "bytes prepended to nothing; proves options arrive", "")}

    @hookimpl
    def kvtier_open(self, options, namespace):
        self.prefix = options["prefix"].encode()
        self.namespace = namespace

    @hookimpl
    def kvtier_capabilities(self):
        return Capabilities(thread_safe=False, extra={"prefix": self.prefix.decode()})

    @hookimpl
    def kvtier_put(self, keys, blocks):
        self._check()
        for key, block in zip(keys, blocks):
            self.blocks.setdefault(key, bytes(block))
        return [True] * len(keys)

    @hookimpl
    def kvtier_get(self, keys):
        self._check()
        return [self.blocks.get(key) for key in keys]

    @hookimpl
    def kvtier_lookup(self, keys):
        self._check()
        return [key in self.blocks for key in keys]

    @hookimpl
    def kvtier_evict(self, keys):
        self._check()
        return [self.blocks.pop(key, None) is not None for key in keys]

    @hookimpl
    def kvtier_close(self):
        self.closed = True

    def _check(self):
        if self.closed:
            raise ClosedError("sample backend is closed")


class SlowBackend(SampleBackend):
    """A sample backend whose gets take ``delay_per_mib`` seconds per MiB they return.

    A tier made slow on purpose, for the chain's load decision; the delay may be
    changed while open (``instance.delay_per_mib``), as a tier that degrades.
    With ``root``, blocks are files in that folder (named by the key's hex), so
    that a fresh process finds what another stored.  ``hiccup`` delays the first
    get only, as the engine's own threads can delay one read.  ``persistent``
    declares the folder persistent (where a chain keeps its catalog and what it
    learned of recomputing).
    """

    def __init__(self) -> None:
        super().__init__()
        self.delay_per_mib = 0.0
        self.hiccup = 0.0
        self.root: Path | None = None
        self.persistent = False

    @hookimpl
    def kvtier_options(self):
        return {
            "prefix": Option("str", "unused", ""),
            "delay_per_mib": Option("float", "seconds a get takes per MiB it returns", 0.0),
            "root": Option("str", "a folder to keep blocks in (default: memory)", ""),
            "hiccup": Option("float", "seconds the first get takes on top", 0.0),
            "persistent": Option("bool", "declare the root persistent", False),
        }

    @hookimpl
    def kvtier_capabilities(self):
        return Capabilities(thread_safe=False, persistent=self.persistent and bool(self.root))

    @hookimpl
    def kvtier_open(self, options, namespace):
        self.delay_per_mib = options["delay_per_mib"]
        self.hiccup = options["hiccup"]
        self.persistent = options["persistent"]
        self.namespace = namespace
        if options["root"]:
            self.root = Path(options["root"]) / str(namespace)
            self.root.mkdir(parents=True, exist_ok=True)

    @hookimpl
    def kvtier_put(self, keys, blocks):
        if self.root is None:
            return SampleBackend.kvtier_put(self, keys, blocks)
        self._check()
        for key, block in zip(keys, blocks):
            path = self.root / key.hex()
            if not path.exists():
                temp = path.with_suffix(f".{os.getpid()}.tmp")
                temp.write_bytes(bytes(block))
                temp.replace(path)
        return [True] * len(keys)

    @hookimpl
    def kvtier_get(self, keys):
        if self.root is None:
            found = SampleBackend.kvtier_get(self, keys)
        else:
            self._check()
            found = [self._read(key) for key in keys]
        hiccup, self.hiccup = self.hiccup, 0.0
        time.sleep(hiccup + self.delay_per_mib * sum(len(b) for b in found if b is not None)
                   / 2**20)
        return found

    @hookimpl
    def kvtier_lookup(self, keys):
        if self.root is None:
            return SampleBackend.kvtier_lookup(self, keys)
        self._check()
        return [(self.root / key.hex()).exists() for key in keys]

    @hookimpl
    def kvtier_evict(self, keys):
        if self.root is None:
            return SampleBackend.kvtier_evict(self, keys)
        self._check()
        held = []
        for key in keys:
            try:
                (self.root / key.hex()).unlink()
                held.append(True)
            except FileNotFoundError:
                held.append(False)
        return held

    def _read(self, key):
        try:
            return (self.root / key.hex()).read_bytes()
        except FileNotFoundError:
            return None


class BadParamBackend(SampleBackend):
    @hookimpl
    def kvtier_get(self, keys, timeout):  # 'timeout' is not in the spec
        return [None] * len(keys)


class TypoBackend(SampleBackend):
    @hookimpl
    def kvtier_gett(self, keys):  # misspelt hook
        return [None] * len(keys)


class UnmarkedBackend(SampleBackend):
    def kvtier_lookup(self, keys):  # forgot @hookimpl
        return [False] * len(keys)


class MissingHookBackend:
    @hookimpl
    def kvtier_put(self, keys, blocks):
        return [True] * len(keys)
