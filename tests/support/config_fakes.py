"""What the config tests load: the example chain, two fake backends, and the checks on errors.

``tests/config/test_config_*.py`` test kvtier.config: loading, validation errors
with file:line and key, env, secrets.  :class:`FakeHost` and :class:`FakeFs`
declare options of every type, so the loader is checked against them alone
(the ``registry`` fixture in ``tests/config/conftest.py``); :func:`fails`
loads a source and checks where, key and reason of the error.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from kvtier.config import load_config
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import ConfigError, Option, hookimpl

EXAMPLE = """\
chain:
  - name: ram
    backend: host
    capacity: 8GiB
    eviction: arc
  - name: nvme
    backend: fs
    url: file:///var/cache/kvtier
    capacity: 500GiB
    codec: zstd
    write: back
"""

GiB = 1024**3
SECRET = "hunter2-very-secret"


def _check_prefix(value: Any) -> None:
    if not str(value).startswith("file://") and not str(value).startswith("memory://"):
        raise ValueError("url must start with file:// or memory://")


def _check_token(value: Any) -> None:
    raise ValueError(f"token {value!r} is revoked")


class _Fake:
    OPTIONS: Mapping[str, Option] = {}

    @hookimpl
    def kvtier_options(self) -> Mapping[str, Option]:
        return self.OPTIONS

    @hookimpl
    def kvtier_put(self, keys: Sequence[bytes], blocks: Sequence[bytes]) -> list[bool]:
        return [True] * len(keys)

    @hookimpl
    def kvtier_get(self, keys: Sequence[bytes]) -> list[None]:
        return [None] * len(keys)

    @hookimpl
    def kvtier_lookup(self, keys: Sequence[bytes]) -> list[bool]:
        return [False] * len(keys)

    @hookimpl
    def kvtier_evict(self, keys: Sequence[bytes]) -> list[bool]:
        return [False] * len(keys)


class FakeHost(_Fake):
    OPTIONS = {
        "capacity": Option("size", "Byte capacity", required=True),
        "eviction": Option("str", "Eviction policy", default="lru", choices=("lru", "arc")),
        "max_block_size": Option("size", "Largest block"),
    }


class FakeFs(_Fake):
    OPTIONS = {
        "url": Option("str", "Where blocks live", required=True, check=_check_prefix),
        "capacity": Option("size", "Byte capacity", default="1GiB"),
        "timeout": Option("duration", "I/O timeout", default="2s"),
        "retries": Option("int", "Retries", default=3),
        "ratio": Option("float", "Fill ratio", default=0.9),
        "sync": Option("bool", "fsync", default=False),
        "paths": Option("list", "Extra paths"),
        "headers": Option("map", "Extra headers"),
        "token": Option("str", "Access token", secret=True),
        "pin": Option("str", "PIN", secret=True, check=_check_token),
    }


def write(tmp_path: Path, text: str, name: str = "tiers.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return str(path)


def fails(source: Any, registry: BackendRegistry, where: str, key: str | None,
          fragment: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(source, registry=registry)
    err = info.value
    assert err.where == where, str(err)
    assert err.key == key, str(err)
    assert fragment in err.reason, str(err)
    assert str(err) == ": ".join(p for p in (where, key, err.reason) if p)
    return err
