"""Group ``lifecycle``, continued: several instances in one process, and refused options.

kvtier opens several instances of a backend in one process: a chain opens
each tier, and opens and closes extra instances on the same options for its
catalog, ``kvtier inspect`` and the like.  So an instance must own what it
closes: closing one must leave every other instance working, whether it
serves the same namespace or another.  Each namespace counts its own bytes
(``used_bytes``): one figure for the whole store would charge one
namespace's capacity with another's blocks.  And a value ``kvtier_open``
refuses is a :class:`~kvtier.spec.ConfigError` whose ``key`` names the
option, which is how an error points at the line of the file to fix.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from kvtier.spec import ConfigError

from .base import KitBackend, KitBase, kit_group
from .data import block_for, describe, key_of
from .resolve import validate_options

__all__ = ["InstanceTests", "bad_values"]

#: Values of each numeric option type that a backend may refuse at open.
_BAD: dict[str, tuple[Any, ...]] = {
    "int": (-1, 0),
    "float": (-1.0,),
    "size": (0, -1),
    "duration": (-1.0,),
}


def bad_values(declared: dict[str, Any], given: dict[str, Any]) -> list[tuple[str, Any]]:
    """``(option, value)`` pairs to open with: each numeric option set to a doubtful value.

    Options the test's own options set are left alone (they may name a
    location or a server the backend needs).
    """
    return [
        (name, value)
        for name, option in sorted(declared.items())
        if name not in given
        for value in _BAD.get(option.type, ())
    ]


@kit_group("lifecycle")
class InstanceTests(KitBase):
    """Runs for every backend."""

    def _instances_check(self, kit: KitBackend, blocks: dict[bytes, bytes], what: str) -> None:
        try:
            got = kit.get(list(blocks))
            new = key_of("instances-after", len(blocks))
            block = block_for(new, 256)
            stored = kit.put([new], [block])
            back = kit.get([new])
            kit.stats()
        except Exception as exc:
            raise AssertionError(
                f"after {what}, this instance raised {exc!r}: closing an instance must release "
                "only what that instance opened, since kvtier opens and closes extra instances "
                "(the chain's catalog) beside the tier it serves"
            ) from exc
        for (key, want), have in zip(blocks.items(), got):
            assert have == want, (
                f"after {what}, get({key!r}) on this instance returned {describe(want, have)}"
            )
        assert stored == [True] and back == [block], (
            f"after {what}, a put on this instance answered {stored} and read back "
            f"{describe(block, back[0])}"
        )
        blocks[new] = block

    def test_closing_another_instance_leaves_this_one_open(self) -> None:
        keys = [key_of("instances", i) for i in range(3)]
        blocks = {k: block_for(k, 300 + i) for i, k in enumerate(keys)}
        assert self.store.put(keys, list(blocks.values())) == [True] * 3, "put of 3 blocks"
        same = self.open_backend()  # as the chain's catalog does on the tier's options
        same.get(keys)
        same.close()
        self._instances_check(self.store, blocks, "another instance of the same namespace closed")
        other = self.open_backend(secrets.token_hex(16))
        other.put([keys[0]], [block_for(keys[0] + b"/o", 100)])
        other.close()
        self._instances_check(self.store, blocks, "an instance of another namespace closed")

    def test_each_namespace_counts_its_own_bytes(self) -> None:
        used = self.store.stats().get("used_bytes")
        if used is None:
            pytest.skip(f"backend {self.backend!r} reports no used_bytes")
        other = self.open_backend(secrets.token_hex(16))
        before = other.stats().get("used_bytes")
        keys = [key_of("own-bytes", i) for i in range(4)]
        blocks = [block_for(k, 2000) for k in keys]
        assert self.store.put(keys, blocks) == [True] * 4, "put of 4 blocks of 2000 bytes"
        mine = self.store.stats().get("used_bytes")
        theirs = other.stats().get("used_bytes")
        assert mine is not None and mine >= used + 4 * 2000, (
            f"used_bytes went from {used} to {mine} after a put of 4 blocks of 2000 bytes"
        )
        assert theirs == before, (
            f"a put of 8000 bytes in namespace {self.namespace} changed used_bytes of another "
            f"namespace's instance from {before} to {theirs}: used_bytes (and the capacity) "
            "count the blocks of the instance's own namespace"
        )

    def test_bad_option_value_raises_config_error_with_key(self) -> None:
        declared = dict(self.store.handle.options())
        tried: list[str] = []
        for name, value in bad_values(declared, self.raw_options):
            try:
                options = validate_options(self.backend, {**self.raw_options, name: value})
            except ConfigError:
                continue  # the declaration already refuses it, with the key
            kit = self.new_backend()
            tried.append(f"{name}={value!r}")
            try:
                kit.handle.open(options, self.namespace)
            except ConfigError as exc:
                assert exc.key is not None and name in exc.key, (
                    f"kvtier_open refused {name}={value!r} with ConfigError({exc}) whose key is "
                    f"{exc.key!r}: key= names the option, so the error points at its line"
                )
            except Exception as exc:
                raise AssertionError(
                    f"kvtier_open refused {name}={value!r} with {exc!r}; a bad option value "
                    f"is a kvtier.spec.ConfigError with key={name!r}"
                ) from exc
            finally:
                kit.close()
        if not tried:
            pytest.skip(f"backend {self.backend!r} declares no numeric option the kit can vary")
