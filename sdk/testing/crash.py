"""Group ``crash_safety``: a writer killed with SIGKILL leaves every block absent or exact.

Two tests, two ways of choosing the instant of the kill:

* at every step of a put: a writer process (:mod:`kvtier.testing.crash_child`,
  ``steps`` mode) numbers the I/O calls the backend makes while it puts a
  fixed plan of blocks and kills itself before call number *k*, for every *k*
  (or ``crash_points`` of them, spread over the whole plan, when there are
  more).  A backend that writes a block in two steps (a prefix then the rest,
  data before an index, a file in place) is stopped between them on every
  run.  After each kill, blocks of puts that returned must be exact, the
  block being put must be absent or exact, and the store must take new puts.
* at random instants: a writer streams blocks until it is killed at a
  moment spread across the put of a large block, ``crash_rounds`` times; this
  reaches inside calls the first test cannot see into (native code, a
  server).

A backend whose puts make no I/O call the first test can see (all its writes
are native: obstore's PUT, LMDB's commit in C) has no step to kill before.
The first test fails at zero kill points unless the backend says so, with a
reason: a class attribute ``kit_native_writes = "why"`` on the backend (read
like ``kit_tamper``, so ``kvtier conformance`` sees it too), or
``native_writes`` on the kit's test class.  Declared, zero kill points skip
the first test with that reason; the second still runs and must pass.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar

import pytest

from .base import KitBase, kit_group
from .data import KIB, MIB, block_for, crash_key, crash_plan, crash_size, describe, key_of, shown

__all__ = ["CrashSafetyTests", "native_writes_of", "spread_points"]

#: Generous hang guards for a child's answers, not performance assertions.
_START_TIMEOUT = 120.0
_JOB_TIMEOUT = 300.0


class _Child:
    """A ``crash_child`` process whose output lines are collected as they come."""

    def __init__(self, config: dict[str, Any]) -> None:
        env = dict(os.environ)
        # the child must import what this process imports (factory paths, tests/)
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kvtier.testing.crash_child", json.dumps(config)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        self.lines: list[tuple[float, str]] = []
        self.errors: list[str] = []
        self.changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read_out, daemon=True),
            threading.Thread(target=self._read_err, daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read_out(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append((time.monotonic(), line.strip()))
                self.changed.notify_all()
        with self.changed:
            self.lines.append((time.monotonic(), "eof"))
            self.changed.notify_all()

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.errors.append(line)

    def wait_for(self, start: int, prefix: str, timeout: float) -> int | None:
        """Index of the first line from ``start`` on beginning with ``prefix`` (or "eof")."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                for index in range(start, len(self.lines)):
                    text = self.lines[index][1]
                    if text.startswith(prefix) or text == "eof":
                        return index
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.changed.wait(left)

    def stderr_tail(self) -> str:
        return "".join(self.errors)[-3000:]

    def stop(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        for reader in self._readers:
            reader.join(10.0)


def spread_points(events: int, puts: Sequence[tuple[int, int]], most: int) -> list[int]:
    """Which I/O calls to kill before: all ``events`` if ``most`` allow, else a spread.

    ``puts`` are the ``[start, end)`` call ranges of each put.  A spread keeps
    the first two and last two calls of every put (where a multi-step write
    starts and publishes) and fills the rest evenly over the whole plan.
    """
    if events <= most:
        return list(range(events))
    chosen: set[int] = set()
    for start, end in puts:
        chosen.update(x for x in (start, start + 1, end - 2, end - 1) if start <= x < end)
    free = max(0, most - len(chosen))
    if free:
        chosen.update(round(i * (events - 1) / max(1, free - 1)) for i in range(free))
    return sorted(chosen)


def native_writes_of(instance: object, declared: str | None) -> str | None:
    """Why ``instance``'s writes are native: ``declared`` (the test class's), or its own
    ``kit_native_writes``; None when neither says.  A declaration without a reason fails."""
    reason = declared if declared is not None else getattr(instance, "kit_native_writes", None)
    if reason is None:
        return None
    if not isinstance(reason, str) or not reason.strip():
        pytest.fail(
            f"kit_native_writes (or native_writes) is {reason!r}: a declaration of native "
            "writes is a sentence saying why the backend's puts make no I/O call the kit can "
            "see, printed where the every-step crash test is skipped"
        )
    return reason.strip()


@kit_group("crash_safety")
class CrashSafetyTests(KitBase):
    """Runs when the backend declares ``persistent=True``."""

    #: Random-instant rounds: writers killed at a moment inside a large put.
    crash_rounds: ClassVar[int] = 3
    #: Most kill points of the every-step test (each costs a fork and a reopen).
    crash_points: ClassVar[int] = 48
    #: Bytes one streaming writer writes at most before it waits to be killed.
    crash_max_bytes: ClassVar[int] = 256 * MIB
    #: Why the backend's puts make no I/O call the every-step test can see
    #: (its writes are native); overrides the backend's ``kit_native_writes``.
    native_writes: ClassVar[str | None] = None

    def _crash_config(self, mode: str, limit: int, **extra: Any) -> dict[str, Any]:
        if not hasattr(signal, "SIGKILL") or not hasattr(os, "fork"):
            pytest.skip("crash safety needs SIGKILL and fork (POSIX)")
        try:
            options = json.loads(json.dumps(self.raw_options))
        except TypeError as exc:
            pytest.fail(f"crash safety passes backend_options to a child process as JSON: {exc}")
        return {
            "mode": mode,
            "backend": self.backend,
            "options": options,
            "namespace": self.namespace,
            "limit": limit,
            **extra,
        }

    def _crash_limit(self, share: int) -> int:
        """Largest block a writer puts: within the declared limits and 1/``share`` of capacity."""
        limits = [4 * MIB, self.block_limit() or 4 * MIB]
        if self.caps.capacity is not None:
            limits.append(max(1, self.caps.capacity // share))
        return min(limits)

    # --- every step of a put -----------------------------------------------
    @contextmanager
    def _crash_server(self, limit: int) -> Iterator[_Child]:
        child = _Child(self._crash_config("steps", limit))
        try:
            if child.wait_for(0, "ready", _START_TIMEOUT) is None or not any(
                text == "ready" for _, text in child.lines
            ):
                pytest.fail(f"the crash writer did not start:\n{child.stderr_tail()}")
            yield child
        finally:
            child.stop()

    def _crash_job(self, child: _Child, prefix: str, kill_at: int | None) -> list[str]:
        """Run one writer; the lines it printed."""
        assert child.proc.stdin is not None
        start = len(child.lines)
        child.proc.stdin.write(json.dumps({"prefix": prefix, "kill_at": kill_at}) + "\n")
        child.proc.stdin.flush()
        end = child.wait_for(start, "exit", _JOB_TIMEOUT)
        if end is None or child.lines[end][1] == "eof":
            pytest.fail(f"the crash writer stopped answering:\n{child.stderr_tail()}")
        lines = [text for _, text in child.lines[start:end]]
        status = int(child.lines[end][1].split()[1])
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            pytest.fail(
                f"the writer of {prefix!r} failed before it was killed:\n{child.stderr_tail()}"
            )
        return lines

    def _crash_verify_plan(self, prefix: str, lines: list[str], limit: int, note: str) -> None:
        """Blocks of returned puts exact, of the interrupted put absent or exact, others absent."""
        begun = {int(t.split()[1]) for t in lines if t.startswith("begin")}
        done = {int(t.split()[1]) for t in lines if t.startswith("done")}
        self.store = self.open_backend()
        plan = crash_plan(limit)
        keys = [crash_key(prefix, i) for batch in plan for i, _ in batch]
        self.remember_stored(self.namespace, keys)
        for number, batch in enumerate(plan):
            batch_keys = [crash_key(prefix, i) for i, _ in batch]
            for (_, size), key, have in zip(batch, batch_keys, self.store.get(batch_keys)):
                want = block_for(key, size)
                if number in done:
                    assert have == want, (
                        f"{note}: {key!r}, whose put had returned, read back "
                        f"{describe(want, have)}; a persistent backend keeps an acknowledged "
                        "block through a crash of the writer"
                    )
                elif number in begun:
                    assert have is None or have == want, (
                        f"{note}: {key!r}, whose put was interrupted, read back "
                        f"{describe(want, have)}; a torn block must be a miss"
                    )
                else:
                    assert have is None, f"{note}: {key!r} was never put, yet read back data"
        probe = key_of("after-crash", 0)
        block = block_for(probe, 4 * KIB)
        assert self.store.put([probe], [block]) == [True], f"{note}: a put after the crash failed"
        assert self.store.get([probe]) == [block], f"{note}: a block put after the crash is lost"
        # keep the store small for the next writer: its blocks must not be capacity victims
        self.store.evict([*keys, probe])
        self.store.close()

    def test_sigkill_at_every_step_of_a_put(
        self, record_property: Callable[[str, object], None]
    ) -> None:
        limit = self._crash_limit(share=8)
        native = native_writes_of(self.store.handle.instance, self.native_writes)
        self.store.close()  # some stores admit one process at a time
        with self._crash_server(limit) as child:
            census = self._crash_job(child, "census", None)
            events = [int(t.split()[1]) for t in census if t.startswith("events")]
            assert events, f"the writer did not get through its puts:\n{child.stderr_tail()}"
            if not events[0]:
                record_property("kill_points", 0)
                if native is not None:
                    # a declaration excuses zero points only: steps it can see are killed
                    pytest.skip(
                        f"0 kill points, the backend's writes are native: {native} "
                        "(test_sigkill_at_random_instants_leaves_no_partial_blocks kills "
                        "inside them)"
                    )
                pytest.fail(
                    "0 kill points: the writer's puts made no I/O call the kit can see "
                    "(open, write, fsync, rename, sendall, execute, commit, ...), so there is "
                    "no step to kill it before and nothing was certified. If the backend's "
                    "writes are native code (obstore's PUT, LMDB's commit in C), declare it "
                    'with a reason: kit_native_writes = "why" on the backend class (or '
                    "native_writes on the kit's test class); this test then skips with that "
                    "reason, and test_sigkill_at_random_instants_leaves_no_partial_blocks, "
                    "which kills inside native calls, still runs"
                )
            self._crash_verify_plan("census", census, limit, "killed after its last put")
            counts = [0] + [int(t.split()[2]) for t in census if t.startswith("done")]
            points = spread_points(events[0], list(itertools.pairwise(counts)), self.crash_points)
            record_property("kill_points", len(points))
            record_property("io_calls", events[0])
            print(f"crash_safety: {len(points)} kill points of {events[0]} I/O calls")
            for number, point in enumerate(points):
                lines = self._crash_job(child, f"s{number}", point)
                note = f"writer killed before I/O call {point} of {events[0]} of its puts"
                self._crash_verify_plan(f"s{number}", lines, limit, note)

    # --- random instants ----------------------------------------------------
    def _crash_stream(self, prefix: str, limit: int, aim: bool) -> int:
        """Run a streaming writer, kill it mid-stream; answer the highest key index it began.

        The kill comes at a random moment after the first put began; with
        ``aim`` it waits for the next put of a large block to begin and strikes
        at a random point of the time such puts took so far.
        """
        config = self._crash_config("stream", limit, prefix=prefix, max_bytes=self.crash_max_bytes)
        child = _Child(config)
        try:
            first = child.wait_for(0, "begin", _START_TIMEOUT)
            if first is not None and child.proc.poll() is None:
                time.sleep(self.rng.uniform(0.0, 0.25))
                if aim:
                    self._crash_aim(child, limit)
            early = child.proc.poll()
        finally:
            child.stop()
        if early is not None:
            pytest.fail(
                f"the writer process ended by itself (exit status {early}) before it was "
                f"killed:\n{child.stderr_tail()}"
            )
        begins = [int(t.split()[2]) for _, t in child.lines if t.startswith("begin")]
        assert begins, f"the writer never began a put:\n{child.stderr_tail()}"
        return max(begins)

    def _crash_aim(self, child: _Child, limit: int) -> None:
        """Sleep until a random point inside the next put of a large block."""
        durations: list[float] = []
        began: float | None = None
        large = False
        for stamp, text in list(child.lines):
            if text.startswith("begin"):
                first, last = (int(x) for x in text.split()[1:3])
                large = max(crash_size(i, limit) for i in range(first, last + 1)) >= 256 * KIB
                began = stamp
            elif text.startswith("done") and large and began is not None:
                durations.append(stamp - began)
        start = len(child.lines)
        while True:
            found = child.wait_for(start, "begin", 60.0)
            if found is None or child.lines[found][1] == "eof":
                return
            first, last = (int(x) for x in child.lines[found][1].split()[1:3])
            if max(crash_size(i, limit) for i in range(first, last + 1)) >= 256 * KIB:
                break
            start = found + 1
        took = sum(durations) / len(durations) if durations else 0.002
        time.sleep(self.rng.uniform(0.0, took))

    def _crash_check_stream(self, prefix: str, top: int, limit: int) -> None:
        keys = [crash_key(prefix, i) for i in range(top + 4)]
        self.remember_stored(self.namespace, keys)
        for start in range(0, len(keys), 16):
            batch = keys[start : start + 16]
            for offset, (key, have) in enumerate(zip(batch, self.store.get(batch))):
                index = start + offset
                if have is None:
                    continue
                want = block_for(key, crash_size(index, limit)) if index <= top else None
                assert have == want, (
                    f"after a SIGKILL, {key!r} returned {describe(want, have)}; "
                    "a block must be absent or exact"
                )

    def test_sigkill_at_random_instants_leaves_no_partial_blocks(self) -> None:
        limit = self._crash_limit(share=1)
        self.store.close()  # some stores admit one process at a time
        rounds: list[tuple[str, int]] = []
        for number in range(self.crash_rounds):
            prefix = f"r{number}"
            # the first round kills blindly, later ones aim inside a put
            rounds.append((prefix, self._crash_stream(prefix, limit, aim=number > 0)))
            self.store = self.open_backend()
            for done_prefix, top in rounds:
                self._crash_check_stream(done_prefix, top, limit)
            # the store must still work after a crash, not only read
            probe = key_of("after-crash", number)
            block = block_for(probe, 4 * KIB)
            flags = self.store.put([probe], [block])
            assert flags == [True], (
                f"put answered {flags} where [True] was expected: "
                "a put of blocks within the declared limits stores each and answers True"
            )
            got = self.store.get([probe])
            assert got == [block], (
                f"get returned {shown(got)} where [block] was expected: "
                "a block reads back exactly as stored, and a key not stored is a miss"
            )
            self.store.close()
