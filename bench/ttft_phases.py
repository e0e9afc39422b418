"""Where a hit's time to first token goes, for ``bench/vllm_ttft.py``.

The engine processes run with ``KVTIER_PHASES=1`` (:mod:`kvtier.observe.phases`):
the chain records when each of its jobs was submitted, started, finished and
polled, every backend call's span, and the CPU worker its copies to the
device.  :func:`breakdown` cuts one prompt's wall time, ``generate`` call to
return, into consecutive phases that add up to the TTFT:

* ``vllm to lookup``: vLLM adds and schedules the request, up to the first
  lookup job the kvtier tier sends to its chain;
* ``lookup``: from that job to the load's submission (the lookup job, the
  scheduler steps until vLLM asks again and promotes the hits);
* ``job queue``: the load waits for a chain worker;
* ``reads``: the backend calls of the load (the fs tier reads straight into
  the rows of vLLM's CPU tier: no copy follows);
* ``checks``: the rest of the load job: headers and checksums, and handing
  the blocks to the promotion queue;
* ``until polled``: the finished job waits for the scheduler to poll it;
* ``vllm to copy``: vLLM schedules the request with its loaded tokens;
* ``to device``: the CPU tier's copy into the engine's KV cache;
* ``compute``: the prefill of the tokens not loaded, and the first token.

:func:`medium_read` times the medium alone: O_DIRECT reads of a list of
``(path, offset, length)`` pieces on a few threads; :func:`object_read` a
raw obstore GET of every large object of a bucket.
"""

from __future__ import annotations

import mmap
import os
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from kvtier.tierbench.ceilings import drop_page_cache as drop_files  # what kvtier bench drops by

__all__ = ["PHASES", "ascii_chart", "breakdown", "draw", "drop_page_cache",
           "medium_read", "object_read", "one_file", "pieces", "svg_chart"]

PHASES = ("vllm to lookup", "lookup", "job queue", "reads", "checks", "until polled",
          "vllm to copy", "to device", "compute")
_ALIGN = 4096
_O_DIRECT = getattr(os, "O_DIRECT", 0)


def drop_page_cache(root: str | os.PathLike[str]) -> None:
    """Push every file under ``root`` out of the page cache (fsync, then
    ``POSIX_FADV_DONTNEED``: :func:`kvtier.tierbench.ceilings.drop_page_cache`)."""
    drop_files([Path(folder, name) for folder, _, names in os.walk(root) for name in names])


def breakdown(spans: Iterable[Any], t0: float, t1: float) -> dict[str, float] | None:
    """The phases of one prompt timed from ``t0`` to ``t1``; None if it loaded nothing.

    ``spans``: :class:`kvtier.observe.phases.Span` tuples ``(what, start,
    end, blocks)`` recorded during the prompt.  Several load jobs are taken
    together, from the first one's submission to the last one's poll.
    """
    inside = [s for s in spans if t0 <= s[1] <= t1]

    def of(what: str) -> list[Any]:
        return [s for s in inside if s[0] == what]

    queued, jobs, polled = of("get queued"), of("get job"), of("get polled")
    devices = of("to device")
    if not (queued and jobs and polled and devices):
        return None
    submitted = min(s[1] for s in queued)
    lookups = [s for s in of("lookup queued") if s[1] <= submitted]
    first_lookup = min((s[1] for s in lookups), default=submitted)
    started, ended = min(s[1] for s in jobs), max(s[2] for s in jobs)
    reads = [s for s in of("backend get") if started <= s[1] <= ended]
    read_end = max((s[2] for s in reads), default=started)
    heard = max(s[1] for s in polled)
    copy_start, copy_end = min(s[1] for s in devices), max(s[2] for s in devices)
    marks = [t0, first_lookup, submitted, started, read_end, ended, heard, copy_start,
             copy_end, t1]
    out = {name: max(0.0, b - a) for name, a, b in zip(PHASES, marks, marks[1:])}
    out["ttft"] = t1 - t0
    out["blocks"] = float(sum(s[3] for s in jobs))
    return out


# the medium alone -----------------------------------------------------------------------
def pieces(paths: Sequence[Path], request: int = 4 << 20) -> list[tuple[str, int, int]]:
    """``(path, offset, length)`` reads of at most ``request`` bytes covering every file."""
    out = []
    for path in paths:
        size = path.stat().st_size
        for offset in range(0, size, request):
            out.append((str(path), offset, min(request, size - offset)))
    return out


def one_file(path: Path, size: int) -> Path:
    """A file of ``size`` random bytes at ``path`` (kept if it already has that size)."""
    if not path.exists() or path.stat().st_size != size:
        with open(path, "wb") as f:
            left = size
            while left:
                n = min(left, 8 << 20)
                f.write(os.urandom(n))
                left -= n
            f.flush()
            os.fsync(f.fileno())
    return path


def medium_read(reads: Sequence[tuple[str, int, int]], threads: int) -> float:
    """Seconds to read every piece with O_DIRECT on ``threads`` threads, out of the page cache.

    Each thread reads into a page-aligned buffer of its own; a file is
    dropped from the page cache (fsync, ``POSIX_FADV_DONTNEED``) first.
    """
    drop_files(sorted({Path(p) for p, _, _ in reads}))
    longest = max(n for _, _, n in reads)
    todo = iter(reads)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def worker() -> None:
        buf = memoryview(mmap.mmap(-1, -(-longest // _ALIGN) * _ALIGN))
        fds: dict[str, int] = {}
        try:
            while True:
                with lock:
                    piece = next(todo, None)
                if piece is None:
                    return
                path, offset, n = piece
                fd = fds.get(path)
                if fd is None:
                    fd = fds[path] = os.open(path, os.O_RDONLY | _O_DIRECT)
                want = -(-n // _ALIGN) * _ALIGN
                if os.preadv(fd, [buf[:want]], offset) < n:
                    raise OSError(f"short read of {path} at {offset}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            for fd in fds.values():
                os.close(fd)

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


def object_read(s3: dict[str, str], min_size: int, threads: int) -> tuple[float, int, int]:
    """Seconds to GET every object of at least ``min_size`` bytes in a bucket with
    obstore on ``threads`` threads (as the ``object`` tier reads), its bytes and count.

    ``s3``: ``endpoint``, ``bucket``, ``access_key``, ``secret_key``.
    """
    from concurrent.futures import ThreadPoolExecutor

    import obstore
    from obstore.store import S3Store

    store = S3Store(s3["bucket"], config={
        "endpoint": s3["endpoint"], "access_key_id": s3["access_key"],
        "secret_access_key": s3["secret_key"], "region": "us-east-1"},
        client_options={"allow_http": True})
    paths = [m["path"] for batch in obstore.list(store) for m in batch if m["size"] >= min_size]
    with ThreadPoolExecutor(threads) as pool:
        start = time.perf_counter()
        sizes = list(pool.map(lambda p: len(memoryview(obstore.get(store, p).bytes())), paths))
        elapsed = time.perf_counter() - start
    return elapsed, sum(sizes), len(sizes)


# charts ---------------------------------------------------------------------------------
def ascii_chart(rows: Sequence[tuple[str, dict[str, float]]], width: int = 72) -> str:
    """One bar per row, each phase a letter, to scale; a legend below."""
    letters = "LlqRCpvDc"
    longest = max(sum(v for k, v in parts.items() if k in PHASES) for _, parts in rows)
    scale = width / longest if longest else 0.0
    lines = []
    for label, parts in rows:
        bar = "".join(letters[i] * round(parts.get(p, 0.0) * scale) for i, p in enumerate(PHASES))
        total = sum(parts.get(p, 0.0) for p in PHASES)
        lines.append(f"{label:<34}|{bar:<{width}}| {total * 1000:6.1f} ms")
    legend = ", ".join(f"{c}={p}" for c, p in zip(letters, PHASES))
    return "\n".join([*lines, f"{'':<34} {legend}"])


#: one colour per phase, in :data:`PHASES` order (matplotlib's tab10)
_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
            "#7f7f7f", "#bcbd22")


def svg_chart(rows: Sequence[tuple[str, dict[str, float]]], title: str) -> str:
    """:func:`ascii_chart` as an SVG: stacked bars in ms, a legend below; no dependency."""
    label_w, bar_w, row_h, top = 230, 520, 26, 34
    longest = max(sum(parts.get(p, 0.0) for p in PHASES) for _, parts in rows) or 1.0
    scale = bar_w / longest
    height = top + row_h * len(rows) + 30 + 18 * ((len(PHASES) + 2) // 3)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + bar_w + 80}" '
           f'height="{height}" font-family="sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="10" y="20" font-size="14">{_escape(title)}</text>']
    for r, (label, parts) in enumerate(rows):
        y, x = top + r * row_h, float(label_w)
        out.append(f'<text x="10" y="{y + 15}">{_escape(label)}</text>')
        for phase, colour in zip(PHASES, _COLOURS):
            w = parts.get(phase, 0.0) * scale
            if w > 0:
                out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 6}" '
                           f'fill="{colour}"><title>{phase}: {parts[phase] * 1000:.1f} ms'
                           '</title></rect>')
                x += w
        total = sum(parts.get(p, 0.0) for p in PHASES)
        out.append(f'<text x="{x + 6:.1f}" y="{y + 15}">{total * 1000:.1f} ms</text>')
    y = top + row_h * len(rows) + 14
    for i, (phase, colour) in enumerate(zip(PHASES, _COLOURS)):
        lx, ly = 10 + (i % 3) * 250, y + (i // 3) * 18
        out.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{colour}"/>'
                   f'<text x="{lx + 18}" y="{ly + 11}">{phase}</text>')
    return "\n".join([*out, "</svg>", ""])


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def draw(path: Path, rows: Sequence[tuple[str, dict[str, float]]], title: str) -> bool:
    """A stacked bar chart of ``rows`` as a PNG; False where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 1.8))
    labels = [label for label, _ in rows]
    left = [0.0] * len(rows)
    for phase in PHASES:
        widths = [parts.get(phase, 0.0) * 1000 for _, parts in rows]
        if any(widths):
            ax.barh(labels, widths, left=left, label=phase)
            left = [a + b for a, b in zip(left, widths)]
    ax.invert_yaxis()
    ax.set_xlabel("ms (medians)")
    ax.set_title(title)
    ax.legend(ncol=3, fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True
