"""The packages import each other the way their docstrings say, so the layout stays the design.

Each package's ``__init__.py`` docstring has a paragraph that starts with
"May import" and names, as :mod:`kvtier.X`, the packages and modules of kvtier
its modules may import (or says "May import nothing of kvtier").  That
paragraph is the rule: the tests read it, and check every import of kvtier
in every module of the package, those inside functions included (only those
under ``if TYPE_CHECKING:`` are not imports at run time).  A module may
always import its own package and the modules beside it.  ``kvtier`` alone
names the top package's own modules, not everything below it.

The modules also import each other without a cycle, counting the imports
inside functions: a cycle is not made acceptable by deferring one side.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: source folder -> the import name it is installed as (pyproject's package-dir)
SOURCES = {"sdk": "kvtier", "spec": "kvtier.spec", "backends": "kvtier.backends",
           "contrib": "kvtier.contrib"}
#: folders inside the sources that are not part of the kvtier distribution
OTHER_DISTRIBUTIONS = ("contrib/kvtier-redis",)

_RULE = re.compile(r"^May import\b.*?(?:\n\s*\n|\Z)", re.M | re.S)
_NAME = re.compile(r":mod:`~?(kvtier(?:\.\w+)*)`")


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    target: str  # the kvtier module (or package) imported
    deferred: bool  # inside a function


def packages(root: Path = ROOT) -> dict[str, Path]:
    """Every package of the distribution: import name -> its folder."""
    found = {}
    for folder, name in SOURCES.items():
        for init in sorted((root / folder).rglob("__init__.py")):
            rel = init.parent.relative_to(root / folder)
            if any(init.parent.is_relative_to(root / o) for o in OTHER_DISTRIBUTIONS):
                continue
            found[".".join([name, *rel.parts])] = init.parent
    return found


def _own(package: str, folder: Path) -> set[str]:
    """The package and the modules beside its ``__init__.py`` (C extensions included)."""
    return {package} | {f"{package}.{p.name.split('.')[0]}" for p in folder.iterdir()
                        if p.suffix in (".py", ".pyi", ".so", ".c") and p.stem != "__init__"}


def _modules(root: Path) -> set[str]:
    return {m for package, folder in packages(root).items() for m in _own(package, folder)}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports(path: Path, module: str, is_package: bool, known: set[str]) -> Iterator[Import]:
    """Every import of kvtier in the module at ``path``, except those under TYPE_CHECKING."""

    def walk(node: ast.AST, deferred: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    yield from walk_one(stmt, deferred)
                continue
            yield from walk_one(child, deferred)

    def walk_one(node: ast.AST, deferred: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "kvtier":
                    yield Import(path, node.lineno, alias.name, deferred)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                base = ".".join(parts[:len(parts) - node.level + 1] +
                                ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base.split(".")[0] == "kvtier":
                for alias in node.names:  # a name that is a module is that module
                    sub = f"{base}.{alias.name}"
                    yield Import(path, node.lineno, sub if sub in known else base, deferred)
        else:
            yield from walk(node, deferred or isinstance(
                node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda))

    yield from walk(ast.parse(path.read_text(), str(path)), False)


def allowed(package_folder: Path) -> set[str] | None:
    """What the package's docstring says it may import; None where it says nothing."""
    tree = ast.parse((package_folder / "__init__.py").read_text())
    doc = ast.get_docstring(tree) or ""
    rule = _RULE.search(doc)
    if rule is None:
        return None
    if rule.group(0).startswith("May import nothing of kvtier"):
        return set()
    return set(_NAME.findall(rule.group(0)))


def _permitted(target: str, own: set[str], rule: set[str]) -> bool:
    if target in own:
        return True
    return any(target == name or (name != "kvtier" and target.startswith(name + "."))
               for name in rule)


def violations(root: Path = ROOT) -> list[str]:
    """Each import that breaks its package's rule, as ``path:line: imports X``."""
    known = _modules(root)
    found = []
    for package, folder in packages(root).items():
        rule = allowed(folder)
        if rule is None:
            found.append(f"{folder.relative_to(root)}/__init__.py: no 'May import' paragraph")
            continue
        own = _own(package, folder)
        for path in sorted(folder.glob("*.py")):
            module = package if path.stem == "__init__" else f"{package}.{path.stem}"
            for imp in imports(path, module, path.stem == "__init__", known):
                if not _permitted(imp.target, own, rule):
                    found.append(f"{path.relative_to(root)}:{imp.line}: imports {imp.target}, "
                                 f"not in {package}'s 'May import' ({', '.join(sorted(rule))})")
    return found


def cycles(root: Path = ROOT) -> list[list[str]]:
    """The import cycles among kvtier's modules, imports inside functions included."""
    known = _modules(root)
    graph: dict[str, set[str]] = {}
    for package, folder in packages(root).items():
        for path in sorted(folder.glob("*.py")):
            module = package if path.stem == "__init__" else f"{package}.{path.stem}"
            graph[module] = {i.target for i in imports(path, module, path.stem == "__init__",
                                                       known)} - {module}
    found: list[list[str]] = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []

    def connect(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in graph:
                continue
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_every_package_says_what_it_may_import() -> None:
    assert len(packages()) >= 20
    missing = [name for name, folder in packages().items() if allowed(folder) is None]
    assert missing == []


def test_every_package_imports_only_what_its_docstring_allows() -> None:
    assert violations() == []


def test_no_import_cycles_even_through_imports_inside_functions() -> None:
    assert cycles() == []


def test_the_spec_imports_nothing_of_kvtier() -> None:
    assert allowed(ROOT / "spec") == set()


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


_TREE = {
    "spec/__init__.py": '"""The spec.\n\nMay import nothing of kvtier.\n"""\n',
    "spec/types.py": "X = 1\n",
    "sdk/__init__.py": '"""Top.\n\nMay import :mod:`kvtier.low`.\n"""\n',
    "sdk/low/__init__.py": '"""Low.\n\nMay import :mod:`kvtier.spec`.\n"""\n',
    "sdk/low/a.py": "from kvtier.spec.types import X\n",
    "sdk/high/__init__.py": ('"""High.\n\nMay import :mod:`kvtier.low` and\n:mod:`~kvtier.spec`, '
                             'not ``kvtier.chain``.\n\nMore: :mod:`kvtier.other`.\n"""\n'),
    "sdk/high/b.py": "from kvtier.low import a\nfrom . import c\n",
    "sdk/high/c.py": "import kvtier.spec\n",
    "backends/__init__.py": '"""Backends.\n\nMay import :mod:`kvtier.spec`.\n"""\n',
    "contrib/__init__.py": '"""Contrib.\n\nMay import nothing of kvtier.\n"""\n',
}


def test_the_checker_passes_a_tree_that_keeps_its_rules(tmp_path: Path) -> None:
    root = _plant(tmp_path, _TREE)
    assert set(packages(root)) == {"kvtier", "kvtier.low", "kvtier.high", "kvtier.spec",
                                   "kvtier.backends", "kvtier.contrib"}
    assert allowed(root / "sdk/high") == {"kvtier.low", "kvtier.spec"}
    assert violations(root) == []
    assert cycles(root) == []


def test_the_checker_catches_a_planted_violation_inside_a_function(tmp_path: Path) -> None:
    root = _plant(tmp_path, {**_TREE, "sdk/low/bad.py": (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from kvtier.high import b  # not at run time: allowed\n"
        "def f():\n    from kvtier.high.c import kvtier  # deferred, still a layer crossed\n")})
    assert violations(root) == [
        "sdk/low/bad.py:5: imports kvtier.high.c, not in kvtier.low's 'May import' "
        "(kvtier.spec)"]


def test_the_checker_catches_an_import_of_the_spec_and_a_missing_rule(tmp_path: Path) -> None:
    root = _plant(tmp_path, {**_TREE, "spec/bad.py": "import kvtier.low.a\n",
                             "contrib/x/__init__.py": '"""No rule here."""\n'})
    assert sorted(violations(root)) == [
        "contrib/x/__init__.py: no 'May import' paragraph",
        "spec/bad.py:1: imports kvtier.low.a, not in kvtier.spec's 'May import' ()"]


def test_the_checker_catches_a_cycle_dodged_by_a_deferred_import(tmp_path: Path) -> None:
    root = _plant(tmp_path, {**_TREE, "sdk/low/a.py": "from . import d\n",
                             "sdk/low/d.py": "def f():\n    from .a import X\n"})
    assert violations(root) == []
    assert cycles(root) == [["kvtier.low.a", "kvtier.low.d"]]
