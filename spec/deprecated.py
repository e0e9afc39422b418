"""Hooks that left the contract, still accepted for one release.

``kvtier_tamper`` gave the conformance kit raw access to a backend's stored
bytes.  Raw access is the kit's business, not the contract's: the chain
never calls it, and zarr keeps the like in its ``StoreTests`` rather than in
its ``Store``.  It is now :class:`kvtier.testing.RawAccess`: a backend gives
the kit a plain method ``kit_tamper(key, transform)`` (no ``@hookimpl``), or
its test class overrides ``BackendTests.tamper``.

Until the next release the registry still accepts a backend implementing
the hook below (pluggy warns with a ``DeprecationWarning`` when such a
backend is registered), and the kit still uses it, warning too.  Then this
module goes.
"""

# mypy: disable-error-code="empty-body"
# Hook specs are signatures and docstrings only; pluggy never calls them.
from __future__ import annotations

from collections.abc import Callable

from .hookspecs import hookimpl, hookspec

__all__ = ["TAMPER_MOVED", "Tamper", "kvtier_tamper"]

#: What the warnings say: where raw access for the kit lives now.
TAMPER_MOVED = (
    "the hook kvtier_tamper is deprecated and leaves the contract in the next release: "
    "give the conformance kit raw access with a plain method kit_tamper(key, transform) "
    "on the backend, without @hookimpl (kvtier.testing.RawAccess), or override "
    "BackendTests.tamper in your test class"
)


@hookspec(firstresult=True, warn_on_impl=DeprecationWarning(TAMPER_MOVED))
def kvtier_tamper(key: bytes, transform: Callable[[bytes], bytes]) -> bool | None:
    """Deprecated: rewrite a stored block raw, for the conformance kit only.

    Replace the stored bytes ``b`` of ``key`` by ``transform(b)``, bypassing
    the backend's own bookkeeping.  Now ``kit_tamper`` (see the module).

    :param key: one key.
    :param transform: a function from the stored bytes to the bytes to store.
    :return: ``True`` if the key was stored and has been rewritten, ``False``
        if it was not stored.
    """


class Tamper:
    """Deprecated mixin of a :class:`~kvtier.spec.BlockStore`: ``kvtier_tamper`` over ``_tamper``.

    Write ``kit_tamper`` instead (see the module); a backend still on this
    mixin keeps passing the kit for one release, with a warning.
    """

    def _tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        raise NotImplementedError

    @hookimpl
    def kvtier_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        self.ensure_open()  # type: ignore[attr-defined]  # a mixin of BlockStore
        return self._tamper(key, transform)
