"""A YAML file read safely into plain values, with the line of every key path.

Only plain scalars, lists and string-keyed mappings (merges included) are
accepted; aliases are bounded, nesting too, and a key given twice is kept
once and reported, so that validation can go on past it.
"""

from __future__ import annotations

from typing import Any, NoReturn

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import ReaderError

from kvtier.spec import ConfigError

__all__ = ["read_yaml"]

_T = "tag:yaml.org,2002:"
_SCALAR_TAGS = frozenset(_T + t for t in ("str", "int", "float", "bool", "null", "timestamp"))
_MAX_NODES = 100_000  # bounds alias expansion ("billion laughs")
# PyYAML composes (and we walk) nested collections recursively: refuse depth
# that would exhaust the interpreter's stack instead of raising RecursionError
_MAX_DEPTH = 64


def read_yaml(label: str) -> tuple[Any, dict[str, int], list[ConfigError]]:
    """The document's values, the line of each key path, and its duplicate keys."""
    try:
        with open(label, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise ConfigError(f"cannot read the file: {exc.strerror or exc}", where=label) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError("invalid YAML: not UTF-8 text", where=f"{label}:{line}") from None
    try:
        _check_depth(label, text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        detail = "; ".join(str(p) for p in (exc.context, exc.problem) if p)
        raise ConfigError(f"invalid YAML: {detail}", where=f"{label}:{line}") from None
    except ReaderError as exc:
        line = text[: exc.position].count("\n") + 1
        raise ConfigError(f"invalid YAML: {exc.reason} character {exc.character!r}",
                          where=f"{label}:{line}") from None
    if root is None:
        raise ConfigError("the file is empty; expected a mapping with a 'chain' list",
                          where=f"{label}:1")
    walker = _NodeWalker(label)
    return walker.value(root, ""), walker.lines, walker.duplicates


def _check_depth(label: str, text: str) -> None:
    """Refuse collections nested deeper than :data:`_MAX_DEPTH`.

    The parser below the composer is an iterative state machine, so walking
    its events costs no stack whatever the input.
    """
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > _MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark is not None else 1
                raise ConfigError(f"collections nested deeper than {_MAX_DEPTH} levels",
                                  where=f"{label}:{line}")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


class _NodeWalker:
    """Turns composed nodes into plain Python values, recording each path's line."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.lines: dict[str, int] = {}
        #: Keys given twice in a mapping: the first value is kept, and validation goes on.
        self.duplicates: list[ConfigError] = []
        self._ctor = SafeConstructor()
        self._active: set[int] = set()
        self._count = 0

    def _fail(self, node: Node, path: str, reason: str) -> NoReturn:
        raise ConfigError(reason, where=f"{self.label}:{node.start_mark.line + 1}",
                          key=path or None)

    def value(self, node: Node, path: str) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        self._count += 1
        if self._count > _MAX_NODES:
            self._fail(node, path, "document too large (aliases expand to too many values)")
        if id(node) in self._active:
            self._fail(node, path, "recursive alias")
        if isinstance(node, ScalarNode):
            if node.tag not in _SCALAR_TAGS:
                self._fail(node, path, f"unsupported YAML tag {node.tag}")
            if node.tag == _T + "timestamp":
                return node.value  # a date is just text here
            try:
                return self._ctor.construct_object(node)
            except ValueError:  # "0x_", or an int beyond Python's digit limit
                # the exception quotes the text, which may be a secret's
                self._fail(node, path, f"unreadable {node.tag.rpartition(':')[2]} value")
        self._active.add(id(node))
        try:
            if isinstance(node, SequenceNode) and node.tag == _T + "seq":
                return [self.value(item, f"{path}[{i}]") for i, item in enumerate(node.value)]
            if isinstance(node, MappingNode) and node.tag == _T + "map":
                return self._mapping(node, path)
            self._fail(node, path, f"unsupported YAML tag {node.tag}")
        finally:
            self._active.discard(id(node))

    def _mapping(self, node: MappingNode, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            if key_node.tag == _T + "merge":
                merges.append(value_node)
                continue
            if not (isinstance(key_node, ScalarNode) and key_node.tag == _T + "str"):
                self._fail(key_node, path, "mapping keys must be strings")
            key = key_node.value
            sub = f"{path}.{key}" if path else key
            if key in out:
                self.duplicates.append(ConfigError(
                    f"duplicate key {key!r} (first given on line {self.lines[sub]})",
                    where=f"{self.label}:{key_node.start_mark.line + 1}", key=sub))
                continue
            self.lines.setdefault(sub, key_node.start_mark.line + 1)
            out[key] = self.value(value_node, sub)
        merged: dict[str, Any] = {}
        for value_node in merges:  # "<<: *anchor" keys; explicit keys win
            sources = value_node.value if isinstance(value_node, SequenceNode) else [value_node]
            for src in sources:
                if not isinstance(src, MappingNode):
                    self._fail(src, path, "'<<' merges only mappings")
                for k, v in self.value(src, path).items():
                    merged.setdefault(k, v)
        return {**merged, **out}
