"""Raw access: how the kit reaches a backend's stored bytes behind its back.

The ``corruption`` group damages the bytes a backend holds (a flipped byte,
a truncation, another key's bytes) and checks that a chain over the backend
turns each damage into a counted miss.  To damage them it needs a way in
that bypasses the backend's bookkeeping (sizes in an index, caches), the way
bit rot or a truncating crash would.  That way in is the kit's business, not
the contract's: the chain never asks for it.  zarr's ``StoreTests`` asks its
subclasses for ``set`` and ``get`` that bypass the store in the same spirit.

:meth:`kvtier.testing.BackendTests.tamper` is the one place the kit asks.  A
test class may override it; its default takes, in order:

1. the backend's own :class:`RawAccess`: a plain method ``kit_tamper`` (no
   ``@hookimpl``: it is no hook, and only the kit calls it), which lets
   ``kvtier conformance`` run the group without a test module;
2. for one release, the deprecated hook ``kvtier_tamper``
   (:mod:`kvtier.spec.deprecated`), with a ``DeprecationWarning``;
3. nothing: the group skips, saying so.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from kvtier.spec.deprecated import TAMPER_MOVED

__all__ = ["RAW_ACCESS", "RawAccess", "Tamperer", "backend_tamper"]

#: A function ``(key, transform) -> bool`` rewriting one stored block raw.
Tamperer = Callable[[bytes, Callable[[bytes], bytes]], bool]

#: The name :func:`kvtier.testing.groups.missing_capability` is given, among
#: the hooks, when the kit has raw access to a backend.
RAW_ACCESS = "raw access"


@runtime_checkable
class RawAccess(Protocol):
    """What a backend gives the kit to damage its stored bytes."""

    def kit_tamper(self, key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        """Replace the stored bytes ``b`` of ``key`` by ``transform(b)``, raw.

        Bypass the backend's own bookkeeping (sizes in an index, caches):
        what ``kvtier_get`` and ``kvtier_get_into`` serve next must be the
        damaged bytes.  Answer ``True`` if the key was stored and has been
        rewritten, ``False`` if it was not stored; raise
        :class:`~kvtier.spec.ClosedError` once the instance is closed.
        """
        ...


def backend_tamper(instance: object) -> Tamperer | None:
    """The raw access ``instance`` gives the kit itself, or None if it gives none."""
    own = getattr(instance, "kit_tamper", None)
    if callable(own):  # RawAccess, read the way BackendHandle.tamper reads it
        return own  # type: ignore[no-any-return]
    hook = getattr(instance, "kvtier_tamper", None)
    if not callable(hook):
        return None

    def deprecated_hook(key: bytes, transform: Callable[[bytes], bytes]) -> bool:
        warnings.warn(f"backend {type(instance).__name__}: {TAMPER_MOVED}",
                      DeprecationWarning, stacklevel=2)
        return bool(hook(key=key, transform=transform))

    return deprecated_hook
