"""A chain's read of an ``object`` tier against a raw obstore read of the same objects.

    python bench/object_reads.py [--blocks 64] [--size-mib 2] [--reads 7] [--threads 16]
                                 [--busy-step-ms MS]

Starts a SeaweedFS (``tests/support/seaweed.py``), stores ``--blocks`` random blocks
through a chain with one ``object`` tier, then, ``--reads`` times, interleaved:

- ``raw``: obstore GETs of the tier's own objects on ``--threads`` threads, each body
  as one ``Bytes`` (no copy, no check): the medium's rate through the same client;
- ``get``: ``Chain.get`` by the backend's ``get`` (whole objects, then each checked and
  copied into the caller's buffer once all have landed): the path before ``get_into``;
- ``get_into``: ``Chain.get`` straight into the caller's buffers, in runs, each checked
  as it lands (:mod:`kvtier.chain.scatter`); the bodies received by the tier's own
  sockets (``socket_reads``, backends/object/socket_reads.py);
- ``get_into_obstore``: the same with ``socket_reads: false``: each body received by
  obstore, then copied into the buffers;
- ``lookup``: ``Chain.lookup`` of the batch by a chain without a presence cache: a
  HEAD per block;
- ``lookup_index``: the same by a chain opened after the puts, its lookups answered
  by the keys its LIST at open found (``lookup_index``; its short-lived cache of
  answers, ``lookup_cache_ttl``, set to 1 ms so that it answers none).

With ``--busy-step-ms``, a Python thread of the same process spins the whole
time in steps of that many ms and yields the GIL between steps (``time.sleep(0)``),
as vLLM's scheduler steps while a request waits on its load (contrib/vllm/tier.py,
``_yield_gil``): a thread that wants the GIL back after its I/O waits for a
handover, which a spinning thread gives only at a step's end or once per switch
interval (5 ms).

Prints each one's median in ms, and the process's CPU time of the reads.  Every block
read is compared with what was stored.
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import obstore
from obstore.store import S3Store

from kvtier import Chain, Namespace, open_chain

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "support"))
from seaweed import SeaweedServer  # the tests' server, found through the path

NS = Namespace("object-reads", dtype="float32", tokens_per_block=32)


class Busy:
    """A thread running Python in steps of ``step`` seconds, yielding the GIL between them."""

    def __init__(self, step: float) -> None:
        self._step, self._done = step, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="busy")
        self._thread.start()

    def _run(self) -> None:
        while not self._done.is_set():
            end = time.perf_counter() + self._step
            while time.perf_counter() < end:
                pass
            time.sleep(0)

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--size-mib", type=int, default=2)
    parser.add_argument("--reads", type=int, default=7)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--busy-step-ms", type=float, default=0.0,
                        help="a thread holding the GIL in steps this long (0: none)")
    args = parser.parse_args()
    size = args.size_mib << 20
    keys = [b"object-read-%04d" % i for i in range(args.blocks)]
    payloads = [os.urandom(size) for _ in keys]
    with tempfile.TemporaryDirectory() as work, SeaweedServer(Path(work)) as server:
        bucket = server.make_bucket(f"reads-{os.getpid()}")
        tier = {"name": "s3", "backend": "object", "endpoint": server.endpoint,
                "bucket": bucket, "access_key_id": server.access_key,
                "secret_access_key": server.secret_key, "concurrency": args.threads}
        config = {"chain": [tier]}
        raw_store = S3Store(bucket, config={"endpoint": server.endpoint, "region": server.region,
                                            "access_key_id": server.access_key,
                                            "secret_access_key": server.secret_key},
                            client_options={"allow_http": True})
        threads = ThreadPoolExecutor(args.threads)
        memory = mmap.mmap(-1, len(keys) * size)  # page-aligned, as an engine's KV rows are
        view = memoryview(memory)
        outs = [view[i * size : (i + 1) * size] for i in range(len(keys))]
        with open_chain(config, namespace=NS) as chain:
            assert all(chain.put(keys, payloads))
            names = {k.hex() for k in keys}  # the blocks' objects, not the chain's own record
            paths = [p["path"] for chunk in obstore.list(raw_store, None) for p in chunk
                     if p["path"].rsplit("/", 1)[-1] in names]
            assert len(paths) == len(keys), paths[:3]
            scatter = chain.tiers[0]
            by_get = type(scatter)._reads_direct

            def raw() -> None:
                got = list(threads.map(lambda p: obstore.get(raw_store, p).bytes(), paths))
                assert sum(len(b) for b in got) >= len(keys) * size

            def read(direct: bool) -> Callable[[], None]:
                def run() -> None:
                    scatter._reads_direct = (  # type: ignore[method-assign]
                        (lambda: by_get(scatter)) if direct else (lambda: False))
                    assert all(chain.get(keys, outs))
                return run

            uncached = open_chain({"chain": [{**tier, "lookup_cache_ttl": 0}]}, namespace=NS)

            indexed = open_chain({"chain": [{**tier, "lookup_cache_ttl": "1ms"}]}, namespace=NS)
            deadline = time.monotonic() + 30  # its LIST at open runs on a thread of its own
            while (indexed.stats()["tiers"][0]["backend_stats"].get("lookup_index_entries", 0)
                   < len(keys) and time.monotonic() < deadline):
                time.sleep(0.01)

            def lookup(chain: Chain) -> Callable[[], None]:
                def run() -> None:
                    assert chain.lookup(keys) == [0] * len(keys)
                return run

            # bodies received by obstore and copied, as before socket_reads
            by_obstore = open_chain({"chain": [{**tier, "socket_reads": False}]}, namespace=NS)

            def read_by_obstore() -> None:
                assert all(by_obstore.get(keys, outs))

            runs: dict[str, Callable[[], None]] = {
                "raw": raw, "get": read(False), "get_into": read(True),
                "get_into_obstore": read_by_obstore,
                "lookup": lookup(uncached), "lookup_index": lookup(indexed)}
            times: dict[str, list[float]] = {name: [] for name in runs}
            cpu: dict[str, list[float]] = {name: [] for name in runs}
            busy = Busy(args.busy_step_ms / 1000) if args.busy_step_ms > 0 else None
            for _ in range(args.reads):
                for name, fn in runs.items():
                    for out in outs:
                        out[:8] = b"\0" * 8  # a stale buffer cannot pass for a read
                    start, start_cpu = time.perf_counter(), time.process_time()
                    fn()
                    times[name].append(time.perf_counter() - start)
                    cpu[name].append(time.process_time() - start_cpu)
                    if name in ("get", "get_into", "get_into_obstore"):
                        assert all(bytes(o) == p for o, p in zip(outs, payloads)), name
            if busy is not None:
                busy.stop()
            heads = indexed.stats()["tiers"][0]["backend_stats"]["heads"]
            assert heads == 0, f"the indexed chain sent {heads} HEADs"
            uncached.close()
            indexed.close()
            by_obstore.close()
        threads.shutdown()
    medians = {name: 1000 * statistics.median(t) for name, t in times.items()}
    busy_note = f", a thread busy in {args.busy_step_ms:g} ms steps" if args.busy_step_ms else ""
    print(f"{len(keys)} objects of {args.size_mib} MiB, {args.threads} threads{busy_note}, "
          f"median of {args.reads}: " + ", ".join(f"{n} {ms:.1f} ms" for n, ms in medians.items())
          + f"; get_into/raw {medians['get_into'] / medians['raw']:.2f}x"
          + f"; lookup_index/lookup {medians['lookup_index'] / medians['lookup']:.3f}x")
    print("this process's CPU time, median ms: " + ", ".join(
        f"{n} {1000 * statistics.median(t):.1f}" for n, t in cpu.items() if "lookup" not in n))


if __name__ == "__main__":
    main()
