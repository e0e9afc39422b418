"""Run inside a fresh virtual environment holding only the built wheel."""

import importlib.metadata
import os
import sys
import tempfile

import kvtier
import kvtier.backends.fs
import kvtier.backends.host
import kvtier.contrib
import kvtier.spec
from kvtier.plugins.registry import BackendRegistry

assert "site-packages" in kvtier.__file__, kvtier.__file__
files = [str(f) for f in importlib.metadata.distribution("kvtier").files or []]
assert not any(f.startswith(("tests/", "sdk/", "spec/", "backends/")) for f in files), files
assert "kvtier/py.typed" in files
# the one-pass copy and checksum: built into the wheel, with its type stub
assert any(f.startswith("kvtier/block/_xxh3copy.") and f.endswith(".so") for f in files), files
assert "kvtier/block/_xxh3copy.pyi" in files
from kvtier.block import framing  # noqa: E402

assert framing.checks_while_copying()
registry = BackendRegistry()
assert {"host", "fs"} <= set(registry.names()), registry.names()
with tempfile.TemporaryDirectory() as tmp:
    cfg = {"chain": [
        {"name": "ram", "backend": "host", "capacity": "1MiB"},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp}", "write": "back"},
    ]}
    with kvtier.open_chain(cfg, namespace="wheel-smoke") as chain:
        blocks = [os.urandom(100_000) for _ in range(30)]
        keys = [i.to_bytes(4, "big") for i in range(30)]
        assert chain.put(keys, blocks) == [True] * 30
        chain.flush()
        out = [bytearray(100_000) for _ in keys]
        assert chain.get(keys, out) == [True] * 30
        assert [bytes(o) for o in out] == blocks
print(f"wheel OK: kvtier {kvtier.__version__} from {os.path.dirname(kvtier.__file__)}",
      file=sys.stderr)
