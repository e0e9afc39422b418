"""Groups ``persistence`` and ``crash_safety``: blocks outlive the process that stored them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from .base import KitBase
from .data import KIB, MIB, block_for, crash_key, crash_size, describe, key_of

__all__ = ["CrashSafetyTests", "PersistenceTests"]

persistence_group = pytest.mark.kvtier_group("persistence")
crash_group = pytest.mark.kvtier_group("crash_safety")

#: Figures of ``kvtier_stats`` that must read the same after a reopen.
KEPT_STATS = ("used_bytes", "blocks")


class PersistenceTests(KitBase):
    """Runs when the backend declares ``persistent=True``."""

    def _persistence_sizes(self) -> list[int]:
        sizes = [1, 100, 4 * KIB, 65_539, MIB, 3 * MIB + 1]
        limit = self.block_limit()
        if limit is not None:
            sizes = [s for s in sizes if s <= limit]
        if self.caps.capacity is not None:
            while sizes and sum(sizes) > self.caps.capacity // 2:
                sizes.pop()  # stay clear of capacity evictions: they are another group's
        return sizes

    def _persistence_verify(self, model: dict[bytes, bytes | None], note: str) -> None:
        keys = sorted(model)
        got = self.store.get(keys)
        for key, have in zip(keys, got):
            want = model[key]
            assert have == want, f"{note}: get({key!r}) returned {describe(want, have)}"
        found = self.store.lookup(keys)
        for key, hit in zip(keys, found):
            if self.lookup_exact or not hit:
                assert hit is (model[key] is not None), f"{note}: lookup({key!r}) answered {hit}"

    def _persistence_put(
        self, model: dict[bytes, bytes | None], keys: list[bytes], sizes: list[int]
    ) -> None:
        blocks = [block_for(k, s) for k, s in zip(keys, sizes)]
        evicted: list[tuple[bytes, bytes]] = []
        assert self.store.put(keys, blocks, evicted) == [True] * len(keys)
        model.update(zip(keys, blocks))
        for key, _ in evicted:
            model[key] = None

    def _persistence_reopen(self, note: str) -> None:
        before = self.store.stats()
        self.reopen()
        after = self.store.stats()
        for name in KEPT_STATS:
            if name in before and name in after:
                assert after[name] == before[name], (
                    f"{note}: stats()[{name!r}] was {before[name]} before close, "
                    f"{after[name]} after reopen"
                )

    @persistence_group
    def test_blocks_survive_reopen(self) -> None:
        model: dict[bytes, bytes | None] = {}
        sizes = self._persistence_sizes()
        self._persistence_put(model, [key_of("persist", i) for i in range(len(sizes))], sizes)
        small = [key_of("small", i) for i in range(12)]
        self._persistence_put(model, small, [10 + i for i in range(12)])
        gone = small[::3]
        assert self.store.evict(gone) == [True] * len(gone)
        model.update(dict.fromkeys(gone))
        self._persistence_reopen("first reopen")
        self._persistence_verify(model, "after the first reopen")
        # a second cycle: changes made after a reopen persist as well
        more = [key_of("more", i) for i in range(5)]
        self._persistence_put(model, more, [4 * KIB] * 5)
        again = [small[1], more[0]]
        assert self.store.evict(again) == [True, True]
        model.update(dict.fromkeys(again))
        self._persistence_reopen("second reopen")
        self._persistence_verify(model, "after the second reopen")

    @persistence_group
    def test_empty_store_reopens_empty(self) -> None:
        self._persistence_reopen("reopen of an empty store")
        keys = [key_of("nothing", i) for i in range(3)]
        assert self.store.lookup(keys) == [False] * 3
        assert self.store.get(keys) == [None] * 3
        blocks = self.store.stats().get("blocks")
        assert blocks in (None, 0), f"an empty store reopened with stats()['blocks'] = {blocks}"

    @persistence_group
    def test_reopen_without_access_in_between(self) -> None:
        model: dict[bytes, bytes | None] = {}
        keys = [key_of("idle", i) for i in range(4)]
        self._persistence_put(model, keys, [5000] * 4)
        self.reopen()
        self._persistence_reopen("reopen of an untouched store")
        self._persistence_verify(model, "after two reopens")


class CrashSafetyTests(KitBase):
    """Runs when the backend declares ``persistent=True``.

    A child process writes blocks in a loop and is killed with SIGKILL at a
    random moment; afterwards every key it may have written is either absent
    or exact.  ``crash_rounds`` rounds share one store, so each reopen also
    meets the leftovers of every earlier crash.
    """

    #: Bytes one child writes at most before it waits to be killed.
    crash_max_bytes: int = 256 * MIB

    def _crash_child(self, prefix: str, limit: int, aim: bool) -> int:
        """Run a writer, kill it mid-stream; answer the highest key index it began.

        The kill comes at a random moment after the first put began; with
        ``aim`` it then waits for the next put of a large block to begin and
        strikes within two milliseconds, inside the write, where a torn write
        would show.
        """
        try:
            options = json.dumps(self.raw_options)
        except TypeError as exc:
            pytest.fail(f"crash safety passes backend_options to a child process as JSON: {exc}")
        config = {
            "backend": self.backend,
            "options": json.loads(options),
            "namespace": self.namespace,
            "prefix": prefix,
            "limit": limit,
            "max_bytes": self.crash_max_bytes,
        }
        env = dict(os.environ)
        # the child must import what this process imports (factory paths, tests/)
        env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvtier.testing.crash_child", json.dumps(config)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
        )
        lines: list[str] = []
        errors: list[str] = []
        begun = threading.Event()
        large = threading.Event()  # a put of a large block began

        def read_out() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if line.startswith("begin"):
                    begun.set()
                    first, last = (int(x) for x in line.split()[1:3])
                    if max(crash_size(i, limit) for i in range(first, last + 1)) >= 256 * KIB:
                        large.set()
            begun.set()  # the child ended: stop waiting
            large.set()

        def read_err() -> None:
            assert proc.stderr is not None
            errors.append(proc.stderr.read())

        readers = [threading.Thread(target=read_out), threading.Thread(target=read_err)]
        for reader in readers:
            reader.start()
        try:
            # generous: a hang guard, not a performance assertion
            begun.wait(120.0)
            if begun.is_set() and proc.poll() is None:
                time.sleep(self.rng.uniform(0.0, 0.25))
                if aim:
                    large.clear()
                    large.wait(60.0)
                    time.sleep(self.rng.uniform(0.0, 0.002))
            early = proc.poll()
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.wait()
            for reader in readers:
                reader.join()
        if early is not None:
            pytest.fail(
                f"the writer process ended by itself (exit status {early}) before it was "
                f"killed:\n{''.join(errors)[-3000:]}"
            )
        begins = [int(line.split()[2]) for line in lines if line.startswith("begin")]
        assert begins, f"the writer never began a put:\n{''.join(errors)[-3000:]}"
        return max(begins)

    def _crash_check_round(self, prefix: str, top: int, limit: int) -> None:
        keys = [crash_key(prefix, i) for i in range(top + 4)]
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

    @crash_group
    def test_sigkill_leaves_no_partial_blocks(self) -> None:
        if not hasattr(signal, "SIGKILL"):
            pytest.skip("crash safety needs SIGKILL (POSIX)")
        limit = min(self.block_limit() or 4 * MIB, 4 * MIB)
        self.store.close()  # some stores admit one process at a time
        rounds: list[tuple[str, int]] = []
        for number in range(self.crash_rounds):
            prefix = f"r{number}"
            # the first round kills blindly, later ones aim inside a put
            rounds.append((prefix, self._crash_child(prefix, limit, aim=number > 0)))
            self.store = self.open_backend()
            for done_prefix, top in rounds:
                self._crash_check_round(done_prefix, top, limit)
            # the store must still work after a crash, not only read
            probe = key_of("after-crash", number)
            block = block_for(probe, 4 * KIB)
            assert self.store.put([probe], [block]) == [True]
            assert self.store.get([probe]) == [block]
            self.store.close()
