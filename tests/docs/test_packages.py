"""Each distribution's ``packages`` list names exactly the folders that hold an ``__init__.py``.

setuptools installs only the packages listed: a package folder left out of
the list imports from a checkout (the editable install maps whole folders)
and is missing from the wheel.
"""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[2]

#: each distribution's folder (its pyproject.toml) -> the source folders its packages live in
DISTRIBUTIONS = {
    ".": ("sdk", "spec", "backends", "contrib"),
    "contrib/kvtier-redis": ("src",),
}


def listed_folders(project: Path) -> set[Path]:
    """The folder of each package in ``project``'s pyproject.toml, by its ``package-dir``."""
    setup = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping: dict[str, str] = setup.get("package-dir", {})
    folders = set()
    for package in setup["packages"]:
        parts = package.split(".")
        # the longest mapped prefix of the name gives the folder; the rest are subfolders
        cut = max(n for n in range(len(parts) + 1) if ".".join(parts[:n]) in mapping)
        base = project / mapping[".".join(parts[:cut])]
        folders.add(base.joinpath(*parts[cut:]))
    return folders


def package_folders(project: Path, sources: tuple[str, ...]) -> set[Path]:
    """Folders under ``sources`` holding an ``__init__.py``, less other distributions' trees."""
    others = [p.parent for p in (project / s for s in sources) for p in p.rglob("pyproject.toml")]
    return {
        init.parent
        for source in sources
        for init in (project / source).rglob("__init__.py")
        if not any(other in init.parents for other in others)
    }


@pytest.mark.parametrize("distribution", sorted(DISTRIBUTIONS))
def test_packages_list_every_folder_with_an_init(distribution: str) -> None:
    project = ROOT / distribution
    listed = listed_folders(project)
    found = package_folders(project, DISTRIBUTIONS[distribution])
    assert sorted(str(p.relative_to(ROOT)) for p in found - listed) == [], "not listed"
    assert sorted(str(p.relative_to(ROOT)) for p in listed - found) == [], "listed, no package"
