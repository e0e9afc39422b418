"""Small value types the hooks exchange: declared capabilities and options."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Capabilities", "Option", "OptionType"]

OptionType = Literal["str", "int", "float", "bool", "size", "duration", "list", "map"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend instance declares about itself after ``kvtier_open``.

    The chain and the conformance kit trust these declarations; the kit runs
    only the test groups a backend declares (and checks that it keeps them).
    """

    #: Blocks survive ``close()`` and a reopen with the same options.
    persistent: bool = False
    #: Several processes (or nodes) opening the same options see one store.
    shared: bool = False
    #: Hooks may be called from several threads at once.
    thread_safe: bool = True
    #: Largest block accepted, in bytes; ``None`` for no limit of its own.
    max_block_size: int | None = None
    #: Byte capacity the backend enforces, ``None`` for unbounded.
    capacity: int | None = None
    #: Blocks that capacity pushes out are reported through ``evicted`` in
    #: ``kvtier_put`` (required for a tier below to use ``write: back``).
    reports_evictions: bool = False
    #: Free-form extras shown by ``kvtier backends`` (e.g. ``{"eviction": "arc"}``).
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Option:
    """One option a backend accepts in its YAML tier entry.

    ``type`` drives validation and parsing: ``size`` accepts ``8GiB``-style
    strings or integers, ``duration`` accepts ``250ms``/``2s``/``1m`` or
    seconds.  ``check`` may raise ``ValueError`` with a short reason.
    """

    type: OptionType
    help: str
    default: Any = None
    required: bool = False
    choices: tuple[Any, ...] | None = None
    check: Callable[[Any], None] | None = None
    #: Never printed in full (credentials, secrets).
    secret: bool = False
