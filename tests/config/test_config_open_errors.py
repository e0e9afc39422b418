"""An option a backend refuses only when it opens is reported like a validation problem:
file:line of the option, its key path, and the tier."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from config_fakes import EXAMPLE, FakeFs, write

import kvtier
from kvtier.plugins.registry import BackendRegistry
from kvtier.spec import ConfigError, hookimpl


class RefusesAtOpen(FakeFs):
    """Takes its options as valid, then refuses one when opened (a server would say so)."""

    @hookimpl
    def kvtier_open(self, options: Mapping[str, Any], namespace: str) -> None:
        raise ConfigError("no bucket named kv-missing on the server", key="retries")


def test_an_option_refused_at_open_names_tier_key_and_line(tmp_path: Path,
                                                          registry: BackendRegistry) -> None:
    registry.register("refuses", RefusesAtOpen)
    path = write(tmp_path, EXAMPLE.replace("backend: fs", "backend: refuses")
                 .replace("capacity: 500GiB", "capacity: 500GiB\n    retries: 2"))
    with pytest.raises(ConfigError) as info:
        kvtier.open_chain(path, namespace="open-errors", registry=registry)
    err = info.value
    assert str(err) == (f"{path}:10: chain[1].retries: no bucket named kv-missing on the "
                        "server (tier 'nvme')")
    assert isinstance(err.__cause__, ConfigError)
