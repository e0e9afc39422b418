"""docs/tenants.md's Keep example runs as written: kept blocks survive pressure."""

from __future__ import annotations

import re
from pathlib import Path

DOC = (Path(__file__).parents[2] / "docs" / "tenants.md").read_text()


def test_the_keep_example_runs() -> None:
    section = DOC[DOC.index("## Keep (available"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    exec(compile(code.group(1), "docs/tenants.md#keep", "exec"), {})  # our own docs
