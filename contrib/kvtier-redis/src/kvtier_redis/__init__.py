"""kvtier-redis: a Redis storage tier for kvtier, registered as backend ``redis``.

Installed, it is found through the ``kvtier.backends`` entry point::

    chain:
      - {name: ram, backend: host, capacity: 8GiB}
      - {name: redis, backend: redis, url: "redis://cache:6379/0", capacity: 64GiB, write: back}

See README.md in the distribution for its options and capabilities.

May import kvtier's public packages only: :mod:`kvtier.spec` (the contract),
:mod:`kvtier.block` (buffer sizes), :mod:`kvtier.config` (units) and
:mod:`kvtier.policies` (the ``tenants`` and ``expire`` options and the rule
of a full pool's victim, which its Lua applies on the server).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from .backend import RedisBackend

__all__ = ["RedisBackend", "__version__"]

try:
    __version__ = version("kvtier-redis")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0.0.0"
