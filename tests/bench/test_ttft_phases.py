"""The phase timings behind ``bench/vllm_ttft.py``'s breakdown of a hit.

With ``KVTIER_PHASES=1`` a real chain with an ``fs`` tier records its jobs'
and backend calls' spans (checked in a process of its own: the switch is
read at import); without it nothing is recorded.  ``breakdown`` cuts a
prompt's time into phases that add up to it, in order, and
``medium_read`` reads files with O_DIRECT.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).parents[2]


def _bench_module(name: str) -> ModuleType:
    """``bench/<name>.py`` loaded by its path: bench/ stays off ``sys.path``,
    where its scripts would shadow tests/support modules of the same name
    (bench/vllm_slow_tier.py and tests/support/vllm_slow_tier.py)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


_phases = _bench_module("ttft_phases")
PHASES, ascii_chart, breakdown = _phases.PHASES, _phases.ascii_chart, _phases.breakdown
medium_read, object_read, pieces = _phases.medium_read, _phases.object_read, _phases.pieces

_RECORD = textwrap.dedent("""
    import json, sys, time
    import kvtier
    from kvtier.observe import phases
    config = {"chain": [{"name": "disk", "backend": "fs", "url": sys.argv[1]}]}
    block = bytes(range(256)) * (4096 * 2)  # 2 MiB: read with O_DIRECT where allowed
    with kvtier.open_chain(config, "phases-test") as chain:
        assert chain.put([b"k1", b"k2"], [block, block]) == [True, True]
        phases.take()
        out = [bytearray(len(block)), bytearray(len(block))]
        job = chain.submit_get([b"k1", b"k2"], out)
        assert chain.wait([job])
        results = chain.poll()
        assert [r.result for r in results] == [[True, True]]
        assert out == [bytearray(block)] * 2
    print(json.dumps(phases.take()))
""")


def _record(tmp_path: Path, enabled: str) -> list[list[Any]]:
    env = dict(os.environ, KVTIER_PHASES=enabled)
    done = subprocess.run([sys.executable, "-c", _RECORD, str(tmp_path / "fs")], env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    spans: list[list[Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return spans


def test_a_chain_records_its_load_only_when_enabled(tmp_path: Path) -> None:
    spans = _record(tmp_path / "on", "1")
    kinds = [s[0] for s in spans]
    for what in ("get queued", "get job", "get polled", "backend get"):
        assert what in kinds, f"{what!r} not recorded: {kinds}"
    job = next(s for s in spans if s[0] == "get job")
    read = next(s for s in spans if s[0] == "backend get")
    assert job[3] == 2  # both keys
    assert job[1] <= read[1] <= read[2] <= job[2], "the backend's read lies inside the job"
    assert _record(tmp_path / "off", "") == []


def test_the_phases_add_up_to_the_prompt_in_order() -> None:
    t0 = 100.0
    spans = [
        ("lookup queued", t0 + 0.010, t0 + 0.011, 4),
        ("lookup job", t0 + 0.011, t0 + 0.012, 4),
        ("get queued", t0 + 0.020, t0 + 0.021, 4),
        ("get job", t0 + 0.021, t0 + 0.080, 4),
        ("backend get", t0 + 0.022, t0 + 0.070, 0),
        ("get polled", t0 + 0.083, t0 + 0.083, 4),
        ("to device", t0 + 0.090, t0 + 0.100, 4),
        ("put job", t0 + 0.500, t0 + 0.600, 4),  # after the prompt: not counted
    ]
    parts = breakdown(spans, t0, t0 + 0.140)
    assert parts is not None
    expected = [0.010, 0.010, 0.001, 0.049, 0.010, 0.003, 0.007, 0.010, 0.040]
    assert [round(parts[p], 6) for p in PHASES] == expected
    assert sum(parts[p] for p in PHASES) == pytest.approx(0.140)
    assert parts["blocks"] == 4
    assert breakdown(spans[:2], t0, t0 + 0.140) is None  # no load: no breakdown
    chart = ascii_chart([("hit", parts), ("floor", {"reads": 0.05, "compute": 0.04})])
    assert chart.splitlines()[0].count("R") > chart.splitlines()[0].count("q")


def test_medium_read_reads_every_piece(tmp_path: Path) -> None:
    files = []
    for i, size in enumerate((5 << 20, 3 << 20)):
        path = tmp_path / f"f{i}"
        path.write_bytes(os.urandom(size))
        files.append(path)
    reads = pieces(files)
    assert [(Path(p).name, o, n) for p, o, n in reads] == [
        ("f0", 0, 4 << 20), ("f0", 4 << 20, 1 << 20), ("f1", 0, 3 << 20)]
    try:
        assert medium_read(reads, 2) > 0
    except OSError as exc:  # a filesystem without O_DIRECT (tmpfs)
        pytest.skip(f"O_DIRECT refused here: {exc}")
    with pytest.raises(OSError):
        medium_read([(str(files[1]), 0, 5 << 20)], 1)  # past its end: a short read


def test_object_read_gets_every_large_object(s3_server: Any, bucket: str) -> None:
    import obstore
    from obstore.store import S3Store

    s3 = {"endpoint": s3_server.endpoint, "bucket": bucket, "access_key": s3_server.access_key,
          "secret_key": s3_server.secret_key}
    store = S3Store(bucket, config={"endpoint": s3["endpoint"], "access_key_id": s3["access_key"],
                                    "secret_access_key": s3["secret_key"],
                                    "region": "us-east-1"},
                    client_options={"allow_http": True})
    for i in range(3):
        obstore.put(store, f"ns/block-{i}", os.urandom(2 << 20))
    obstore.put(store, "ns/catalog", b"small")
    elapsed, nbytes, count = object_read(s3, 1 << 20, 2)
    assert (nbytes, count) == (6 << 20, 3)
    assert elapsed > 0
