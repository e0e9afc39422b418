"""The one error hierarchy: every error kvtier raises on purpose is a KvtierError."""

from __future__ import annotations

import inspect

import pytest

import kvtier.spec
from kvtier.spec import errors


def test_every_error_class_lives_in_spec_errors_and_derives_from_kvtier_error() -> None:
    classes = [obj for _, obj in inspect.getmembers(errors, inspect.isclass)
               if obj.__module__ == errors.__name__]
    assert {c.__name__ for c in classes} == set(errors.__all__)
    for cls in classes:
        assert issubclass(cls, errors.KvtierError), cls
        assert cls.__name__.endswith("Error"), cls
        assert getattr(kvtier.spec, cls.__name__) is cls  # exported by the contract


def test_no_error_class_is_defined_outside_spec_errors() -> None:
    import kvtier.block.framing
    import kvtier.peer.protocol

    for module in (kvtier.block.framing, kvtier.peer.protocol):
        own = [obj for _, obj in inspect.getmembers(module, inspect.isclass)
               if obj.__module__ == module.__name__ and issubclass(obj, BaseException)]
        assert own == [], module


@pytest.mark.parametrize(("error", "builtin"), [
    (errors.BackendError, OSError),
    (errors.ConnectionClosedError, ConnectionError),
    (errors.CorruptBlockError, ValueError),
    (errors.ProtocolError, ValueError),
    (errors.VersionMismatchError, ValueError),
    (errors.ConfigError, ValueError),
    (errors.ClosedError, RuntimeError),
])
def test_errors_are_also_the_builtin_callers_catch(error: type, builtin: type) -> None:
    assert issubclass(error, builtin)


def test_error_attributes() -> None:
    assert errors.VersionMismatchError("old", 3).version == 3
    assert errors.RefusedError("bad secret", auth=True).auth is True
    assert errors.ConnectionClosedError("eof", received=7).received == 7
