"""The packages import each other the way their docstrings say, so the layout stays the design."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: package folder -> kvtier packages its modules may import at module level
#: (imports under TYPE_CHECKING or inside functions are not layering)
ALLOWED = {
    "spec": set(),
    "sdk/block": {"spec"},
    "sdk/plugins": {"spec"},
    "sdk/config": {"block", "plugins", "spec"},
    "sdk/observe": {"config", "spec"},
    "sdk/chain": {"block", "config", "observe", "plugins", "spec"},
    "sdk/peer": {"block", "chain", "config", "plugins", "spec"},
    "sdk/plan": {"backends", "chain", "plugins"},
}
_IMPORT = re.compile(r"^(?:from|import) kvtier\.(\w+)", re.M)


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_package_imports_only_the_layers_below_it(folder: str) -> None:
    own = folder.split("/")[-1]
    for path in sorted((ROOT / folder).glob("*.py")):
        used = set(_IMPORT.findall(path.read_text())) - {own}
        assert used <= ALLOWED[folder], (path.relative_to(ROOT), used - ALLOWED[folder])


def test_every_package_says_what_it_may_import() -> None:
    for folder in ALLOWED:
        if folder == "spec":
            continue
        doc = (ROOT / folder / "__init__.py").read_text()
        assert "import" in doc.split('"""')[1].lower(), folder
