"""A minimal kvtier backend, plus deliberately malformed ones for the loader's checks."""

from __future__ import annotations

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
