"""Blocks put by another process, for the tests of what survives the process that wrote it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from typing import Any

# The child resolves the backend through the entry points, as a fresh process does.
_WRITER = textwrap.dedent(
    """
    import json, sys
    from kvtier.plugins.registry import default_registry
    spec = json.loads(sys.stdin.read())
    handle = default_registry().create(spec["backend"])
    handle.open(spec["options"], spec["namespace"])
    keys = [bytes.fromhex(k) for k in spec["keys"]]
    blocks = [bytes.fromhex(b) for b in spec["blocks"]]
    assert handle.put(keys, blocks, []) == [True] * len(keys)
    handle.close()
    """
)


def put_in_another_process(backend: str, options: dict[str, Any], namespace: str,
                           keys: Sequence[bytes], blocks: Sequence[bytes]) -> None:
    """A new Python process opens ``backend`` with ``options`` on ``namespace``, puts ``blocks``
    under ``keys`` (every one must be stored), closes it and exits."""
    spec = {"backend": backend, "options": options, "namespace": namespace,
            "keys": [k.hex() for k in keys], "blocks": [b.hex() for b in blocks]}
    done = subprocess.run([sys.executable, "-c", _WRITER], input=json.dumps(spec),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
