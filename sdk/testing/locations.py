"""Fresh storage locations per test for ``kvtier conformance`` (no pytest import).

A backend's options may name a local location: an option called one of
:data:`LOCATION_OPTIONS` holding a path, or any option whose value is a
``file:///`` URL.  ``kvtier conformance`` gives every test its own copy of
each such location, and removes it after the test:

* a location that is an existing directory ``D`` becomes
  ``D/kvtier-conformance-TOKEN/TEST``, created empty;
* any other ``P/NAME`` (a directory or a file the backend creates) becomes
  ``P/kvtier-conformance-TOKEN/TEST/NAME``, left for the backend to create.

The ``kvtier-conformance-TOKEN`` directory goes at the end of the run, and so
do parent directories the run had to create.  Every other option (a server
URL, a bucket, a ``memory://`` name) is shared by all tests, which keep apart
by using a fresh random namespace each and evicting the keys they stored when
they end.
"""

from __future__ import annotations

import re
import secrets
import shutil
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["LOCATION_OPTIONS", "FreshLocations"]

#: Option names that name a directory of a local store.
LOCATION_OPTIONS = frozenset({"path", "dir", "directory", "root"})
_FILE_URL = "file://"


def _location(name: str, value: Any) -> Path | None:
    """The directory option ``name`` names, or None if it names no local location."""
    if not isinstance(value, str) or not value:
        return None
    if value.startswith(_FILE_URL + "/"):
        return Path(value[len(_FILE_URL) :])
    if name in LOCATION_OPTIONS and "://" not in value:
        return Path(value).absolute()
    return None


class FreshLocations:
    """The per-test locations of one run, made from the options as given."""

    def __init__(self, options: Mapping[str, Any], token: str | None = None) -> None:
        self.options = dict(options)
        self.token = token or secrets.token_hex(4)
        #: option name -> (directory the run directory goes in, leaf name or None)
        self.bases: dict[str, tuple[Path, str | None]] = {}
        for name, value in options.items():
            where = _location(name, value)
            if where is None:
                continue
            if where.is_dir():
                self.bases[name] = (where, None)
            else:
                self.bases[name] = (where.parent, where.name)
        self._created: list[Path] = []

    def run_dir(self, name: str) -> Path:
        return self.bases[name][0] / f"kvtier-conformance-{self.token}"

    def describe(self) -> list[str]:
        """One line per fresh option, for the report's header."""
        lines = []
        for name, (_, leaf) in self.bases.items():
            shown = f"{self.run_dir(name)}/TEST" + (f"/{leaf}" if leaf else "")
            lines.append(f"{name}: {shown}, fresh per test")
        return lines

    def start(self) -> None:
        """Create the run's directories (remembering the parents that did not exist)."""
        for name in self.bases:
            top = self.run_dir(name)
            while not top.parent.exists():
                top = top.parent
            self._created.append(top)
            self.run_dir(name).mkdir(parents=True, exist_ok=True)

    def finish(self) -> None:
        """Remove what :meth:`start` and the tests created."""
        for top in self._created:
            shutil.rmtree(top, ignore_errors=True)
        self._created = []

    @contextmanager
    def for_test(self, test: str) -> Iterator[dict[str, Any]]:
        """The options of test ``test``, each location fresh, removed afterwards."""
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", test).strip("_") or "test"
        options = dict(self.options)
        made: list[Path] = []
        for name, (_, leaf) in self.bases.items():
            directory = self.run_dir(name) / safe
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            made.append(directory)
            target = directory / leaf if leaf else directory
            value = str(options[name])
            options[name] = f"{_FILE_URL}{target}" if value.startswith(_FILE_URL) else str(target)
        try:
            yield options
        finally:
            for directory in made:
                shutil.rmtree(directory, ignore_errors=True)
