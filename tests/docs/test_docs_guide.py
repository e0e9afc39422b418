"""docs/writing-a-backend.md keeps working: its plugin, packaging, kit module and commands run.

Code blocks whose first line is ``# file: PATH`` are files of the example
project and are written to a temporary directory; the other ``python`` blocks
run there as scripts, the test module runs under pytest, and the ``$ kvtier
conformance`` and ``$ pytest`` lines of ``console`` blocks run as commands.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "writing-a-backend.md"
TEXT = GUIDE.read_text()
CLI = "from kvtier.cli.conformance import conformance_command; conformance_command()"


def code_blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", TEXT, flags=re.S)


def file_of(block: str) -> str | None:
    match = re.match(r"# file: (\S+)\n", block)
    return match.group(1) if match else None


FILES = {file_of(b): b for lang in ("python", "toml") for b in code_blocks(lang) if file_of(b)}
SNIPPETS = [b for b in code_blocks("python") if not file_of(b)]
COMMANDS = [
    line.removeprefix("$ ")
    for block in code_blocks("console")
    for line in block.splitlines()
    if line.startswith("$ ")
]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        assert name is not None
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path


def run(project: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(project), *sys.path]))
    return subprocess.run(
        argv, cwd=project, env=env, capture_output=True, text=True, timeout=600
    )


def test_guide_has_its_examples() -> None:
    assert set(FILES) == {"my_kvstore/backend.py", "pyproject.toml", "tests/test_conformance.py"}
    assert len(SNIPPETS) >= 3
    assert any(c.startswith("kvtier conformance") for c in COMMANDS)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_guide_snippet_runs(project: Path, index: int) -> None:
    script = project / f"snippet_{index}.py"
    script.write_text(SNIPPETS[index])
    proc = run(project, [sys.executable, str(script)])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_guide_entry_point_loads_the_plugin(project: Path) -> None:
    tomllib = pytest.importorskip("tomllib")
    meta = tomllib.loads(FILES["pyproject.toml"])
    entry_points = meta["project"]["entry-points"]["kvtier.backends"]
    assert entry_points == {"my-dict": "my_kvstore.backend:DictBackend"}
    # the value is exactly what the kit and the registry resolve: load and validate it
    check = (
        "from kvtier.testing.resolve import resolve_backend; "
        f"registry, name = resolve_backend({entry_points['my-dict']!r}); "
        "registry.create(name)"
    )
    proc = run(project, [sys.executable, "-c", check])
    assert proc.returncode == 0, proc.stderr


def test_guide_test_module_passes_the_kit(project: Path) -> None:
    proc = run(
        project,
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "tests/test_conformance.py"],
    )
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr
    assert " failed" not in proc.stdout and " passed" in proc.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_guide_command_runs(project: Path, command: str) -> None:
    argv = shlex.split(command)
    if argv[:2] == ["kvtier", "conformance"]:
        argv = [sys.executable, "-c", CLI, *argv[2:]]
    elif argv[0] == "pytest":
        argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *argv[1:]]
    else:
        pytest.fail(f"the guide's commands should be kvtier or pytest lines, got {command!r}")
    proc = run(project, argv)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr
