"""The ``object`` tier's capacity across four writer processes, against real SeaweedFS.

Four processes (tests/support/object_writer_child.py) put distinct blocks
into one capacity-bounded namespace of one bucket at the same time, while a
thread of this process lists the namespace over and over.  Each writer
counts the namespace from its own LIST and its own puts, so the bucket can
hold more than the capacity between passes; how much more is bounded:

    Every object in the namespace was stored by some writer k, and is in k's
    index (its last LIST and its puts since), or among k's uploads not yet
    indexed, or among the victims k trimmed from its index and has not yet
    deleted.  k's index is trimmed to ``capacity`` after every put and every
    LIST.  A writer putting one batch at a time has at most one batch
    uploading, and the victims it has not deleted yet are those of its last
    put (at most a batch, deleted before the put returns) or of a LIST pass
    in its background thread (its own blocks over the capacity when the LIST
    ran, at most the batch then in flight).  So writer k accounts for at
    most ``capacity + 2 * batch`` of its own blocks at any moment, and the
    bucket holds at most ``N * (capacity + 2 * batch)``: an overshoot of at
    most ``(N - 1) * capacity + 2 * N * batch``.  Tighter in practice: for
    any writer i, what i's index lacks is what the others stored since i's
    last LIST began, so the overshoot is also at most i's own batches plus
    what the others stored in that window (``scan_interval`` plus one LIST).
    The proof takes a LIST to show every object stored before it began
    (S3 and SeaweedFS list with strong consistency).

The test asserts the first bound at every sample, and that a LIST after the
writers are done (a new instance's open) brings the namespace back within
the capacity.  A sample is one LIST page (under 1000 objects), but not a
snapshot: the server walks the namespace's folders, so a sample can count
an object deleted while it ran beside one stored later.  Such a sample is
over what the namespace held by what was stored during one LIST (a few ms,
about a block here), far inside the bound's margin over the peaks seen.
Every block reads back exact or is a miss.  The figures are logged;
docs/shared-capacity.md and BENCHMARKS.md quote them.
"""

from __future__ import annotations

import json
import logging
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import obstore
import pytest
from obstore.store import S3Store
from seaweed import SeaweedServer

from kvtier.backends.object import ObjectBackend
from kvtier.plugins.registry import default_registry

log = logging.getLogger("kvtier.tests")
CHILD = Path(__file__).parents[2] / "support" / "object_writer_child.py"
NS = "0123456789abcdef0123456789abcdef"
KiB, MiB = 1024, 1 << 20
WRITERS, SIZE, BATCH, COUNT = 4, 32 * KiB, 4, 96  # each writer 3 MiB, together 12 MiB
CAPACITY = 1 * MiB


def block(key: bytes, size: int) -> bytes:
    return random.Random(key).randbytes(size)  # as the child writes it


def tier_options(server: SeaweedServer, bucket: str, **over: Any) -> dict[str, Any]:
    opts: dict[str, Any] = {k: o.default for k, o in ObjectBackend().kvtier_options().items()}
    opts.update(bucket=bucket, endpoint=server.endpoint, access_key_id=server.access_key,
                secret_access_key=server.secret_key, region=server.region, allow_http=True,
                prefix="pool", capacity=CAPACITY, **over)
    return opts


class Sampler:
    """Lists the namespace until stopped: the largest total of object bytes listed."""

    def __init__(self, server: SeaweedServer, bucket: str, prefix: str) -> None:
        self.store = S3Store(bucket, config={
            "endpoint": server.endpoint, "region": server.region,
            "access_key_id": server.access_key, "secret_access_key": server.secret_key,
        }, client_options={"allow_http": True})
        self.prefix, self.peak, self.samples, self.most = prefix, 0, 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def listed(self) -> dict[str, int]:
        return {meta["path"]: meta["size"]
                for chunk in obstore.list(self.store, self.prefix, chunk_size=1000)
                for meta in chunk}

    def _run(self) -> None:
        while not self._stop.is_set():
            held = self.listed()
            self.peak = max(self.peak, sum(held.values()))
            self.most = max(self.most, len(held))
            self.samples += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def writer(spec: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(CHILD), json.dumps(spec)], text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scan_interval", ["0s", "1s", None], ids=["0s", "1s", "1m"])
def test_four_writers_overshoot_stays_within_the_bound(
    s3_server: SeaweedServer, bucket: str, scan_interval: str | None
) -> None:
    opts = tier_options(s3_server, bucket, scan_interval=scan_interval)
    sampler = Sampler(s3_server, bucket, f"pool/{NS}/")
    procs = [writer({"options": opts, "namespace": NS, "writer": w, "count": COUNT,
                     "batch": BATCH, "size": SIZE}) for w in range(WRITERS)]
    try:
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        started = time.monotonic()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = []
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, out
            reports.append(json.loads(out.splitlines()[-1]))
        seconds = time.monotonic() - started
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        sampler.stop()

    bound = WRITERS * (CAPACITY + 2 * BATCH * SIZE)  # see the module docstring
    log.info("object, %d writers, scan_interval %s, capacity %d: peak %d bytes listed "
             "(%.2fx capacity, %d objects), bound %d; %d samples in %.1fs; LIST passes "
             "per writer %s", WRITERS, scan_interval, CAPACITY, sampler.peak,
             sampler.peak / CAPACITY, sampler.most, bound, sampler.samples, seconds,
             [r["stats"].get("scans") for r in reports])
    assert [r["stored"] for r in reports] == [COUNT] * WRITERS
    assert sampler.samples > 10 and sampler.most < 1000  # one page per LIST
    assert 0 < sampler.peak <= bound, (sampler.peak, bound)
    # a LIST once the writers are done (a new instance's open) trims to the capacity
    handle = default_registry().create("object")
    handle.open(opts, NS)
    try:
        held = sampler.listed()
        assert 0 < sum(held.values()) <= CAPACITY
        keys = [f"w{w}-{i}".encode() for w in range(WRITERS) for i in range(COUNT)]
        found = handle.get(keys)
        assert all(f is None or bytes(f) == block(k, SIZE) for k, f in zip(keys, found))
        assert sum(f is not None for f in found) == len(held)
    finally:
        handle.close()
