"""``submit_put`` stores what each block held at the call, or refuses it: a buffer changed
before the job completed is never stored as the changed bytes nor under a failing checksum."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvtier
from kvtier import Namespace, open_chain
from kvtier.block import framing

NS = Namespace("submit-put-test", dtype="bfloat16", tokens_per_block=32)
KEYS = [b"bytearray", b"array"]
BEFORE, AFTER = bytes(range(256)) * 16, bytes(4096)


def ram_and_disk(tmp_path: Path) -> dict[str, Any]:
    return {"chain": [
        {"name": "ram", "backend": "host", "capacity": "16MiB"},
        {"name": "disk", "backend": "fs", "url": f"file://{tmp_path}/disk", "write": "through"},
    ]}


class Held:
    """A method of one object that holds its callers until resumed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> None:
        self.real: Callable[..., Any] = getattr(owner, name)
        self.reached, self.resume = threading.Event(), threading.Event()
        monkeypatch.setattr(owner, name, self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.reached.set()
        assert self.resume.wait(30), "never resumed"
        return self.real(*args, **kwargs)


def buffers() -> tuple[bytearray, np.ndarray]:
    return bytearray(BEFORE), np.frombuffer(BEFORE, dtype=np.uint16).copy()


def change(buffer: bytearray, array: np.ndarray) -> None:
    buffer[:] = AFTER
    array[:] = 0


def results_of(chain: kvtier.Chain, *jobs: int) -> list[list[bool]]:
    """The results of ``jobs``, once all are done (a poll reports each job once)."""
    assert chain.wait(jobs, timeout=30)
    results = {r.job_id: r for r in chain.poll()}
    assert all(results[job].error is None for job in jobs)
    return [results[job].result for job in jobs]


def tiers_hold(chain: kvtier.Chain) -> list[list[bytes | None]]:
    """What each tier answers for KEYS, read from the tier itself."""
    held = []
    for tier in chain.tiers:
        outs = [bytearray(len(BEFORE)) for _ in KEYS]
        found = tier.get_into(KEYS, [memoryview(o) for o in outs])
        held.append([bytes(o) if f else None for o, f in zip(outs, found)])
    return held


def test_a_buffer_changed_once_the_job_has_it_changes_nothing_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Held where its put reaches the first tier, the job once framed and stored the
    changed bytes under a checksum of them: wrong KV that every check passes."""
    with open_chain(ram_and_disk(tmp_path), namespace=NS) as chain:
        held = Held(monkeypatch, chain.tiers[0], "put_payloads")
        buffer, array = buffers()
        job = chain.submit_put(KEYS, [buffer, array])
        assert held.reached.wait(30)
        change(buffer, array)
        held.resume.set()
        assert results_of(chain, job) == [[True, True]]
        assert chain.flush(30)
        assert chain.get_bytes(KEYS) == [BEFORE, BEFORE]
        assert tiers_hold(chain) == [[BEFORE, BEFORE], [BEFORE, BEFORE]]
        assert [t["corrupt"] for t in chain.stats()["tiers"]] == [0, 0]


@pytest.mark.parametrize("mode", ["one-pass", "two-passes"])
def test_a_buffer_changed_before_the_job_read_it_is_refused(
    tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The job runs after another one (one job worker): by then the buffers hold
    other bytes, and neither those nor the ones of the call can be stored."""
    if mode == "two-passes":
        monkeypatch.setattr(framing, "_xxh3copy", None)
    elif not framing.checks_while_copying():
        pytest.skip("kvtier.block._xxh3copy is not built")
    with open_chain(ram_and_disk(tmp_path), namespace=NS, job_workers=1) as chain:
        held = Held(monkeypatch, chain.tiers[0], "get_into")
        first = chain.submit_get([b"other"], [bytearray(1)])
        assert held.reached.wait(30)
        buffer, array = buffers()
        steady = bytes(range(100))
        job = chain.submit_put([*KEYS, b"steady"], [buffer, array, steady])
        change(buffer, array)
        with caplog.at_level(logging.WARNING, logger="kvtier.chain"):
            held.resume.set()
            assert results_of(chain, first, job) == [[False], [False, False, True]]
        assert chain.flush(30)
        assert chain.lookup([*KEYS, b"steady"]) == [None, None, 0]
        assert chain.get_bytes([b"steady"]) == [steady]
        assert tiers_hold(chain) == [[None, None], [None, None]]
        assert [t["corrupt"] for t in chain.stats()["tiers"]] == [0, 0]
    assert "2 of 3 block(s) changed after submit_put" in caplog.text


def test_a_held_put_stores_the_buffers_as_put_would_without_a_checksum_at_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sums_at_call: list[int] = []
    real_digest = framing.digest

    def counting_digest(view: Any) -> int:
        sums_at_call.append(1)
        return real_digest(view)

    monkeypatch.setattr(framing, "digest", counting_digest)
    buffer, array = buffers()
    with open_chain(ram_and_disk(tmp_path), namespace=NS) as chain:
        job = chain.submit_put(KEYS, [buffer, array], held=True)
        assert sums_at_call == []  # the engine holds its buffers: no pass over them here
        assert results_of(chain, job) == [[True, True]]
        assert chain.get_bytes(KEYS) == [BEFORE, BEFORE]
        assert chain.flush(timeout=30)
    with open_chain(ram_and_disk(tmp_path), namespace=NS) as chain:
        assert chain.get_bytes(KEYS) == [BEFORE, BEFORE]  # through to disk, exact
