"""``kvtier bench``: each tier's throughput beside the raw ceiling of its medium.

For every tier (of ``--config``, or of the built-in backends on defaults) the
bench opens a one-tier chain and times batched ``put`` and ``get`` calls
through it, each batch of ``--blocks`` blocks of ``--block-size`` bytes under
fresh keys.  In the same rounds, on the same blocks, it times what the medium
does with no kvtier at all:

* ``host``: ``memcpy`` into preallocated buffers;
* ``fs`` (local paths): plain Python ``open``/``write`` of a temp file and
  ``rename`` into place, ``readinto`` back, one file per block in a directory
  beside the tier's, with the tier's ``fsync``; for a tier with
  ``direct_io``, also written and read with ``O_DIRECT``.
  A read is timed once with the files of both sides in the page cache, put
  there the same way (dropped, then read once, untimed: a tier writing with
  ``O_DIRECT`` leaves nothing there, and files cached by their write read
  back faster than files cached by a read), and once after both were
  dropped from it;
* ``object``: ``obstore.put``/``obstore.get`` against the same bucket, one
  request at a time and ``concurrency`` at a time;
* ``peer``: ``sendall``/``recv_into`` over loopback to a plain socket server
  in a process of its own, as ``kvtier serve`` is.

A tier with ``encrypt`` also has the same tier in plaintext beside it, run
through kvtier in the same rounds (:mod:`kvtier.tierbench.twin`); ``--encrypt``
adds encrypted ``fs`` and ``object`` tiers to the built-in ones.  Blocks are
``bytes`` and read buffers ``bytearray``s, or with ``--aligned`` page-aligned
memory, as an engine's KV rows are (which ``O_DIRECT`` takes without a
bounce copy).

The ceilings are in :mod:`kvtier.tierbench.ceilings`.  Every block read back,
by kvtier or raw, is compared with what was written; a difference is
reported, never hidden.  Rounds interleave kvtier and raw so that a
disturbance (a shared machine) hits both; the ratio kvtier/raw is the
figure to read, absolute numbers depend on the machine.

Throughput is bytes over summed batch time in GB/s (10^9 bytes per second);
latency percentiles are per batched call.  ``ratio`` divides throughputs
(all rounds); ``ratio_p50`` divides the median batch times, which one
disturbed round on a shared machine does not move.
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from kvtier.block.namespace import Namespace
from kvtier.chain.chain import Chain
from kvtier.config.chain_config import ChainConfig, MetricsConfig, TierConfig, load_config
from kvtier.tierbench.ceilings import (
    FileRaw,
    MemcpyRaw,
    ObstoreRaw,
    PeerRaw,
    Raw,
    drop_page_cache,
    warm_page_cache,
)
from kvtier.tierbench.first import first_use
from kvtier.tierbench.twin import PlaintextTwin, encrypted_entries, is_encrypted

__all__ = ["BenchSettings", "Progress", "Series", "run_tiers", "tier_plan"]

BUILTIN = ("host", "fs", "object", "peer")


@dataclass
class BenchSettings:
    block_size: int = 2 << 20
    blocks: int = 16  # per batched call
    rounds: int = 8
    quick: bool = False
    backends: tuple[str, ...] = BUILTIN
    config: str | None = None
    #: Also the built-in fs and object tiers with ``encrypt`` on (:mod:`.twin`).
    encrypt: bool = False
    #: Blocks and read buffers page-aligned, as an engine's KV rows are.
    aligned: bool = False


class Progress:
    """A one-line progress bar on a stream (stderr), redrawn in place."""

    def __init__(self, total: int, stream: TextIO | None = None, width: int = 30) -> None:
        self.total, self.done, self.width = total, 0, width
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()

    def add(self, n: int) -> None:
        """More steps became known."""
        self.total += n

    def step(self, label: str, n: int = 1) -> None:
        self.done = min(self.total, self.done + n)
        self.draw(label)

    def draw(self, label: str) -> None:
        filled = self.width * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (self.width - filled)
        elapsed = time.monotonic() - self.started
        line = f"\r[{bar}] {self.done}/{self.total} {elapsed:5.0f}s {label[:40]:<40}"
        self.stream.write(line)
        self.stream.flush()

    def close(self) -> None:
        self.stream.write("\n")
        self.stream.flush()


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    return float(np.percentile(np.asarray(values, dtype=float), q)) if values else float("nan")


@dataclass
class Series:
    """Timings of one kind of batched call."""

    batch_bytes: int
    seconds: list[float] = field(default_factory=list)

    @contextmanager
    def timed(self) -> Iterator[None]:
        start = time.perf_counter()
        yield
        self.seconds.append(time.perf_counter() - start)

    def summary(self) -> dict[str, float | int]:
        total = sum(self.seconds)
        return {
            "gbps": self.batch_bytes * len(self.seconds) / total / 1e9 if total else 0.0,
            "p50_ms": percentile(self.seconds, 50) * 1e3,
            "p99_ms": percentile(self.seconds, 99) * 1e3,
            "batches": len(self.seconds),
        }


@dataclass
class Plan:
    """One tier to measure: its validated entry and the ceilings to set beside it."""

    tier: TierConfig
    raws: Callable[[], list[Raw]]
    note: str = ""
    #: where an fs tier's files are, to time reads after dropping them from the page cache
    files: Path | None = None

    @property
    def ops(self) -> tuple[str, ...]:
        """The operations reported: every tier's put and get, and what only some media have."""
        ops: tuple[str, ...] = ("put", "get")
        if self.tier.backend == "host":
            # a tier opened in a new process: its first blocks land in memory never used
            ops += ("put-first", "get-first")
        if self.files is not None:
            ops += ("get-uncached",)
        return ops


def _chain_of(tier: TierConfig) -> ChainConfig:
    return ChainConfig((tier,), MetricsConfig(), tier.where)


def _local_dir(url: str) -> Path | None:
    if url.startswith("file://"):
        return Path(url[len("file://"):])
    return Path(url) if url.startswith("/") else None


def _raws_for(tier: TierConfig, tag: str, local: bool) -> tuple[Callable[[], list[Raw]], str]:
    opts = dict(tier.options)
    if tier.backend == "host":
        return lambda: [MemcpyRaw()], ""
    if tier.backend == "fs":
        where = _local_dir(str(opts.get("url", "")))
        if where is None:
            return list, "no raw ceiling: not a local path"
        root = where.parent / f"{where.name}-bench-raw-{tag}"
        fsync = bool(opts.get("fsync"))
        if opts.get("direct_io") and hasattr(os, "O_DIRECT"):
            # the tier reads large blocks past the page cache: so does one ceiling
            return lambda: [FileRaw(root, fsync), FileRaw(root / "d", fsync, direct=True)], ""
        return lambda: [FileRaw(root, fsync)], ""
    if tier.backend == "object":
        prefix = "/".join(p for p in (str(opts.get("prefix") or "").strip("/"),
                                      f"kvtier-bench-raw-{tag}") if p)
        n = int(opts.get("concurrency") or 16)
        return lambda: [ObstoreRaw(opts, prefix, 1), ObstoreRaw(opts, prefix, n)], ""
    if tier.backend == "peer":
        if local:
            return lambda: [PeerRaw()], ""
        return list, "no raw ceiling: the server is not one this bench started"
    return list, "no raw ceiling known for this backend"


@contextmanager
def tier_plan(settings: BenchSettings, stack: ExitStack) -> Iterator[tuple[list[Plan], list[str]]]:
    """The tiers to measure, with any server they need started on ``stack``."""
    notes: list[str] = []
    scratch = Path(tempfile.mkdtemp(prefix="kvtier-bench-"))
    stack.callback(shutil.rmtree, scratch, True)
    tag = os.urandom(4).hex()
    if settings.config is not None:
        tiers = list(load_config(settings.config).tiers)
        local_peers: set[str] = set()
    else:
        entries, local_peers = _default_entries(settings, scratch, stack, notes)
        tiers = list(load_config({"chain": entries}).tiers) if entries else []
    plans = []
    for tier in tiers:
        raws, note = _raws_for(tier, tag, tier.name in local_peers)
        files = None
        if tier.backend == "fs" and hasattr(os, "posix_fadvise"):
            files = _local_dir(str(dict(tier.options).get("url", "")))
        plans.append(Plan(tier, raws, note, files))
    yield plans, notes


def _default_entries(settings: BenchSettings, scratch: Path, stack: ExitStack,
                     notes: list[str]) -> tuple[list[dict[str, Any]], set[str]]:
    batch = settings.block_size * settings.blocks
    entries: list[dict[str, Any]] = []
    local: set[str] = set()
    for backend in settings.backends:
        if backend == "host":
            capacity = 4 * batch + (64 << 20)
            entries.append({"name": "host", "backend": "host", "capacity": capacity})
            # the payload checksum on every read is most of what host costs over a copy
            entries.append({"name": "host-noverify", "backend": "host", "capacity": capacity,
                            "verify": False})
        elif backend == "fs":
            entries.append({"name": "fs", "backend": "fs", "url": f"file://{scratch}/fs"})
            entries.append({"name": "fs-cached", "backend": "fs", "direct_io": False,
                            "url": f"file://{scratch}/fs-cached"})
        elif backend == "object":
            entry = _object_entry(stack, notes)
            if entry is not None:
                entries.append(entry)
        elif backend == "peer":
            from kvtier.tierbench.servers import ServeProcess

            server = ServeProcess(scratch, 4 * batch + (64 << 20))
            stack.callback(server.stop)
            entries.append({"name": "peer", "backend": "peer", "peers": [server.start()],
                            "max_payload": max(256 << 20, 2 * batch)})
            local.add("peer")
        else:
            raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BUILTIN)}")
    if settings.encrypt:
        entries += encrypted_entries(entries, scratch)
    return entries, local


def _object_entry(stack: ExitStack, notes: list[str]) -> dict[str, Any] | None:
    endpoint = os.environ.get("KVTIER_BENCH_S3_ENDPOINT")
    entry: dict[str, Any] = {"name": "object", "backend": "object", "prefix": "kvtier-bench"}
    if endpoint:
        bucket = os.environ.get("KVTIER_BENCH_S3_BUCKET")
        if not bucket:
            notes.append("object: KVTIER_BENCH_S3_ENDPOINT set without KVTIER_BENCH_S3_BUCKET")
            return None
        entry.update(endpoint=endpoint, bucket=bucket)
        return entry
    from kvtier.tierbench.servers import WeedProcess, find_weed

    weed = find_weed()
    if weed is None:
        notes.append("object: skipped (no KVTIER_BENCH_S3_ENDPOINT and no weed binary)")
        return None
    server = WeedProcess(weed)
    stack.callback(server.stop)
    entry.update(endpoint=server.start(), bucket=server.bucket,
                 access_key_id="bench", secret_access_key="bench")
    notes.append(f"object: a local SeaweedFS (weed mini) at {server.endpoint}")
    return entry


def _blocks(count: int, size: int, seed: int, aligned: bool = False) -> list[Any]:
    rng = np.random.default_rng(seed)
    if not aligned:
        return [rng.bytes(size) for _ in range(count)]
    blocks = [_aligned(size) for _ in range(count)]
    for block in blocks:
        block[:] = rng.bytes(size)
    return blocks


def _aligned(size: int) -> memoryview:
    """``size`` bytes at a page boundary (mmap memory is page-aligned)."""
    return memoryview(mmap.mmap(-1, max(size, 1)))[:size]


def _check(outs: Sequence[memoryview], blocks: Sequence[bytes]) -> int:
    """How many blocks came back different from what was written."""
    return sum(out != block for out, block in zip(outs, blocks))


def _entry_of(tier: TierConfig) -> dict[str, Any]:
    """The chain entry a validated tier came from (options parsed, defaults filled)."""
    entry = {k: v for k, v in tier.options.items() if v is not None}
    entry.update(name=tier.name, backend=tier.backend, codec=tier.codec,
                 codec_level=tier.codec_level, verify=tier.verify)
    return entry


@dataclass
class _Round:
    """One round's blocks and buffers, shared by kvtier and every ceiling."""

    keys: list[bytes]
    blocks: list[Any]
    outs: list[Any]

    @property
    def names(self) -> list[str]:
        return [k.hex() for k in self.keys]

    def check(self) -> int:
        return _check([memoryview(o) for o in self.outs], self.blocks)

    def clear_outs(self) -> None:
        for buf in self.outs:
            buf[:1] = b"\0"  # a skipped read cannot pass the check


def _kvtier_round(chain: Chain, plan: Plan, r: _Round) -> tuple[dict[str, float], int]:
    """Time kvtier's put and get (and uncached get) of one round; count what went wrong."""
    n = len(r.keys)
    times: dict[str, float] = {}
    start = time.perf_counter()
    stored = chain.put(r.keys, r.blocks)
    times["put"] = time.perf_counter() - start
    files = sorted(plan.files.rglob("*.kvb")) if plan.files is not None else []
    warm_page_cache(files)
    r.clear_outs()
    start = time.perf_counter()
    found = chain.get(r.keys, r.outs)
    times["get"] = time.perf_counter() - start
    bad = (n - sum(stored)) + (n - sum(found)) + r.check()
    if plan.files is not None:
        drop_page_cache(files)
        r.clear_outs()
        start = time.perf_counter()
        found = chain.get(r.keys, r.outs)
        times["get-uncached"] = time.perf_counter() - start
        bad += (n - sum(found)) + r.check()
    chain.evict(r.keys)
    return times, bad


def _raw_round(raw: Raw, r: _Round) -> tuple[dict[str, float], int]:
    names, views = r.names, [memoryview(b) for b in r.blocks]
    out_views = [memoryview(o) for o in r.outs]
    times: dict[str, float] = {}
    r.clear_outs()
    start = time.perf_counter()
    raw.put(names, views)
    times["put"] = time.perf_counter() - start
    if isinstance(raw, (FileRaw, PlaintextTwin)):
        raw.warm_cache(names)
    start = time.perf_counter()
    raw.get(names, out_views)
    times["get"] = time.perf_counter() - start
    bad = r.check()
    if "get-uncached" in raw.reports and isinstance(raw, (FileRaw, PlaintextTwin)):
        raw.drop_cache(names)
        r.clear_outs()
        start = time.perf_counter()
        raw.get(names, out_views)
        times["get-uncached"] = time.perf_counter() - start
        bad += r.check()
    raw.clear(names)
    return times, bad


def _measure_tier(plan: Plan, settings: BenchSettings, namespace: Namespace,
                  progress: Progress) -> list[dict[str, Any]]:
    tier = plan.tier
    n, size = settings.blocks, settings.block_size
    batch = n * size
    blocks = _blocks(n, size, len(tier.name), settings.aligned)
    outs = [_aligned(size) if settings.aligned else bytearray(size) for _ in range(n)]
    kv = {op: Series(batch) for op in plan.ops}
    raws = plan.raws()
    if is_encrypted(tier) and tier.backend in ("fs", "object"):
        # the same tier unencrypted, in the same rounds: what encryption costs
        raws.insert(0, PlaintextTwin(tier, namespace, plan.files))
    raw_series = [{op: Series(batch) for op in plan.ops} for _ in raws]
    bad = {"kvtier": 0, **{raw.label: 0 for raw in raws}}
    chain = Chain(_chain_of(tier), namespace, job_workers=1)
    try:
        for raw in raws:
            if isinstance(raw, MemcpyRaw):
                raw.prepare(n, size)
        for rnd in range(settings.rounds + 1):  # round 0 warms up and is not counted
            r = _Round([os.urandom(16) for _ in range(n)], blocks, outs)
            # alternate who goes first, so neither always meets a cold or a warm medium;
            # -2 is a tier opened for this round alone
            order: list[int] = [-1, *range(len(raws))]
            if "put-first" in plan.ops:
                order.insert(1, -2)
            if rnd % 2:
                order.reverse()
            for who in order:
                if who == -2:
                    # a process of its own: a tier opened where no other ran before it
                    got = first_use(_entry_of(tier), n, size, kvtier_first=rnd % 2 == 0)
                    bad["kvtier"] += got["kvtier"].pop("wrong")
                    for raw, rs in zip(raws, raw_series):
                        if isinstance(raw, MemcpyRaw):
                            bad[raw.label] += got["memcpy"].pop("wrong")
                            for op, seconds in got["memcpy"].items():
                                if rnd > 0:
                                    rs[op].seconds.append(seconds)
                    times, wrong, series, label = got["kvtier"], 0, kv, "kvtier"
                elif who == -1:
                    times, wrong = _kvtier_round(chain, plan, r)
                    series, label = kv, "kvtier"
                else:
                    times, wrong = _raw_round(raws[who], r)
                    series, label = raw_series[who], raws[who].label
                bad[label] += wrong
                if rnd > 0:
                    for op, seconds in times.items():
                        series[op].seconds.append(seconds)
            progress.step(f"{tier.name} round {rnd}/{settings.rounds}")
    finally:
        chain.close()
        for raw in raws:
            raw.close()
    return [_row(plan, op, kv[op], raws, raw_series, bad, n, size) for op in plan.ops]


def _row(plan: Plan, op: str, kv: Series, raws: list[Raw], raw_series: list[dict[str, Series]],
         bad: dict[str, int], n: int, size: int) -> dict[str, Any]:
    raw_op = op
    row: dict[str, Any] = {
        "tier": plan.tier.name, "backend": plan.tier.backend, "op": op,
        "block_size": size, "blocks_per_call": n,
        "kvtier": kv.summary(),
        "raw": [{"name": raw.label, **s[raw_op].summary()}
                for raw, s in zip(raws, raw_series) if raw_op in raw.reports],
        "verified": all(v == 0 for v in bad.values()),
        "mismatches": bad,
    }
    kv_p50 = row["kvtier"]["p50_ms"]
    for raw_row in row["raw"]:
        raw_row["ratio"] = row["kvtier"]["gbps"] / raw_row["gbps"] if raw_row["gbps"] else None
        # the same ratio from the median batches: one disturbed round does not move it
        raw_row["ratio_p50"] = raw_row["p50_ms"] / kv_p50 if kv_p50 else None
    for raw, s in zip(raws, raw_series):
        if isinstance(raw, PlaintextTwin) and raw_op in raw.reports:
            # each round's own ratio, then their median: both sides of a ratio saw the same
            # moment, which a shared machine's drift between rounds does not move
            pairs = [k / t for k, t in zip(kv.seconds, s[raw_op].seconds) if t]
            twin_row = next(r for r in row["raw"] if r["name"] == raw.label)
            twin_row["cost_paired_pct"] = 100 * (statistics.median(pairs) - 1) if pairs else None
    if plan.note:
        row["note"] = plan.note
    return row


def run_tiers(settings: BenchSettings, progress: Progress) -> dict[str, Any]:
    """Measure every planned tier; the ``tiers`` section of the report."""
    namespace = Namespace(f"kvtier-bench-{os.urandom(4).hex()}", dtype="bfloat16",
                          tokens_per_block=16)
    results: list[dict[str, Any]] = []
    with ExitStack() as stack, tier_plan(settings, stack) as (plans, notes):
        progress.add(len(plans) * (settings.rounds + 1))
        for plan in plans:
            results.extend(_measure_tier(plan, settings, namespace, progress))
    return {"results": results, "notes": notes}


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = (0.0, 0.0, 0.0)
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": [round(x, 2) for x in load],
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "copy_and_checksum": _copy_and_checksum(),
    }


def _copy_and_checksum() -> str:
    """How RAM tiers copy and check a payload here: which kernel, or two passes."""
    try:
        from kvtier.block import _xxh3copy
    except ImportError:
        return "two passes (extension not built)"
    return f"one pass ({_xxh3copy.KERNEL})"


def settings_dict(settings: BenchSettings) -> dict[str, Any]:
    return dataclasses.asdict(settings)
