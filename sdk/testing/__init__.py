"""The conformance kit: certify a kvtier backend against the contract.

Subclass :class:`BackendTests` in a test module (pytest collects classes named
``Test*``)::

    import pytest
    from kvtier.testing import BackendTests

    class TestMyBackend(BackendTests):
        backend = "my-backend"          # entry-point name, or "pkg.module:Factory"

        @pytest.fixture
        def backend_options(self, tmp_path):
            return {"path": str(tmp_path), "capacity": "16MiB"}

or run ``kvtier conformance NAME --option KEY=VALUE``.  The ``corruption``
group needs raw access to the stored bytes: a backend's ``kit_tamper``
method (:class:`RawAccess`), or ``tamper`` overridden in the test class
(:mod:`kvtier.testing.raw`).  The pytest plugin
(:mod:`kvtier.testing.plugin`) is registered through the ``pytest11`` entry
point and adds the ``kvtier_group`` marker and ``--kvtier-group``.

Names are imported on first use, so that pytest loading the plugin in every
project does not import Hypothesis or the groups.

May import :mod:`kvtier` (the chain a backend is also run in),
:mod:`kvtier.block`, :mod:`kvtier.config`, :mod:`kvtier.plugins` and
:mod:`kvtier.spec`; never a backend, which it reaches through its entry point.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .base import KitBackend, KitBase
    from .data import block_for, key_of, size_for
    from .groups import GROUPS
    from .raw import RawAccess
    from .stateful import DictModel
    from .suite import BackendTests

__all__ = [
    "GROUPS",
    "BackendTests",
    "DictModel",
    "KitBackend",
    "KitBase",
    "RawAccess",
    "block_for",
    "key_of",
    "size_for",
]

_WHERE = {
    "GROUPS": "groups",
    "BackendTests": "suite",
    "DictModel": "stateful",
    "KitBackend": "base",
    "KitBase": "base",
    "RawAccess": "raw",
    "block_for": "data",
    "key_of": "data",
    "size_for": "data",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'kvtier.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
