"""Kept blocks in the ``fs`` tier's shared pool, on real files: under pressure, from this
process or another, kept blocks survive byte for byte while the unkept go; the tenant's
keep budget holds for every process together; release lets them go; expiry wins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from fs_blocks import as_bytes, blob, files_on_disk, open_fs

from kvtier.plugins.registry import BackendHandle

SIZE = 8 << 10
ACME, GLOBEX = "a" * 32, "b" * 32
SUPPORT = Path(__file__).parents[2] / "support"


def tier(root: Path, handles: list[BackendHandle], ns: str = ACME, tenant: str = "acme",
         **over: Any) -> BackendHandle:
    opts: dict[str, Any] = {
        "capacity": 16 * SIZE, "capacity_scope": "pool", "direct_io": False,
        "tenant": tenant, "tenants": {"acme": {"keep": 4 * SIZE}}, **over}
    return open_fs(root, handles, ns, **opts)


def key(i: int) -> bytes:
    return b"keep-%04d" % i


def put(handle: BackendHandle, ids: range | list[int], seed: int = 0) -> None:
    for i in ids:  # one by one: each may evict
        assert handle.put([key(i)], [blob(SIZE, seed + i)], []) == [True]


def exact(handle: BackendHandle, ids: range | list[int], seed: int = 0) -> list[int]:
    """The ids read back; a wrong byte fails the test."""
    out = []
    for i, data in zip(ids, handle.get([key(i) for i in ids]), strict=True):
        if data is not None:
            assert as_bytes(data) == blob(SIZE, seed + i), i
            out.append(i)
    return out


def test_kept_blocks_survive_a_flood_byte_for_byte_and_their_files_stay(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    acme = tier(tmp_path, handles)
    put(acme, range(8))
    assert acme.keep([key(i) for i in (1, 3, 5)], True) == [True, True, True]
    put(acme, range(100, 160))
    assert exact(acme, range(8)) == [1, 3, 5]
    on_disk = set(files_on_disk(tmp_path, ACME))
    assert {key(1), key(3), key(5)} <= on_disk
    assert not {key(i) for i in (0, 2, 4, 6, 7)} & on_disk
    stats = dict(acme.stats())
    assert stats["kept_bytes"] == 3 * SIZE
    assert stats["used_bytes"] <= 16 * SIZE


def test_the_budget_refuses_marks_beyond_it_for_every_process_together(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    one, two = tier(tmp_path, handles), tier(tmp_path, handles, ns="c" * 32)
    put(one, range(4))
    put(two, range(10, 14))
    assert one.keep([key(i) for i in range(3)], True) == [True] * 3
    # the same tenant in another namespace, by another instance: one block of budget left
    assert two.keep([key(i) for i in range(10, 13)], True) == [True, False, False]
    assert two.keep([key(99)], True) == [None]  # not stored
    assert dict(two.stats())["keep_refused"] == 2
    assert dict(one.stats())["kept_bytes"] == 4 * SIZE
    # released, the room comes back
    assert one.keep([key(0)], False) == [True]
    assert two.keep([key(11)], True) == [True]


def test_a_tenant_without_budget_keeps_nothing(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    globex = tier(tmp_path, handles, ns=GLOBEX, tenant="globex")
    put(globex, range(2))
    assert globex.keep([key(0), key(1)], True) == [False, False]


def test_release_lets_them_go(tmp_path: Path, handles: list[BackendHandle]) -> None:
    acme = tier(tmp_path, handles)
    put(acme, range(4))
    assert acme.keep([key(i) for i in range(4)], True) == [True] * 4
    put(acme, range(100, 140))
    assert exact(acme, range(4)) == [0, 1, 2, 3]
    assert acme.keep([key(i) for i in range(4)], False) == [True] * 4
    put(acme, range(200, 240))
    assert exact(acme, range(4)) == []
    assert dict(acme.stats())["kept_bytes"] == 0


def test_a_put_only_kept_blocks_could_make_room_for_is_refused(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    rules = {"acme": {"quota": 4 * SIZE, "keep": 4 * SIZE}}
    acme = tier(tmp_path, handles, tenants=rules)
    put(acme, range(4))
    assert acme.keep([key(i) for i in range(4)], True) == [True] * 4
    assert acme.put([key(9)], [blob(SIZE, 9)], []) == [False]
    assert exact(acme, range(4)) == [0, 1, 2, 3]


_FLOOD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from fs_blocks import blob, open_fs
from pathlib import Path
spec = json.loads(sys.argv[2])
handles = []
t = open_fs(Path(spec["root"]), handles, spec["ns"], **spec["options"])
for i in range(spec["first"], spec["first"] + spec["count"]):
    assert t.put([b"keep-%04d" % i], [blob(spec["size"], i)], []) == [True]
print(json.dumps(dict(t.stats())))
t.close()
"""


def test_another_process_s_flood_spares_the_kept_blocks(
        tmp_path: Path, handles: list[BackendHandle]) -> None:
    acme = tier(tmp_path, handles)
    put(acme, range(6))
    assert acme.keep([key(0), key(4)], True) == [True, True]
    # another process of the same tenant, on its namespace: its flood evicts acme's own
    options = {"capacity": 16 * SIZE, "capacity_scope": "pool", "direct_io": False,
               "tenant": "acme", "tenants": {"acme": {"keep": 4 * SIZE}}}
    spec = {"root": str(tmp_path), "ns": ACME, "options": options, "first": 1000,
            "count": 60, "size": SIZE}
    done = subprocess.run([sys.executable, "-c", _FLOOD, str(SUPPORT), json.dumps(spec)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr
    flooded = json.loads(done.stdout.strip().splitlines()[-1])
    assert flooded["used_bytes"] <= 16 * SIZE
    assert exact(acme, range(6)) == [0, 4]
