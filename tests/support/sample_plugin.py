"""The sample plugin distribution (``tests/support/kvtier-sample-plugin``), pip-installed
into a folder put on ``sys.path``, so its backends come through a real entry point."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SOURCE = Path(__file__).parent / "kvtier-sample-plugin"


@pytest.fixture(scope="module")
def sample_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The folder the plugin is installed in, on ``sys.path`` for the module's tests."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
         "--no-build-isolation", "--target", str(target), str(SOURCE)],
        check=True,
    )
    sys.path.insert(0, str(target))
    yield str(target)
    sys.path.remove(str(target))
    for name in [m for m in sys.modules if m.startswith("kvtier_sample")]:
        del sys.modules[name]
