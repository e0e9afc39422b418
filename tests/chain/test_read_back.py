"""A tier's load cost learned by reading back what it stored (kvtier.chain.readback).

The tier is the sample plugin's ``sample-slow`` backend with its blocks in a
folder declared persistent, so a later chain (a later process) finds both
the blocks and what the first learned.  A process that stores a prompt and
never loads it reads two of its blocks back once its stores stop, off the
request's path; the next process declines a slow tier by that, without a
probe or any read.
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sample_plugin import sample_plugin

import kvtier
from kvtier.chain import readback
from kvtier.plugins.registry import BackendRegistry

__all__ = ["sample_plugin"]

NS = kvtier.Namespace("read-back", dtype="bfloat16", tokens_per_block=16)
BLOCK = 64 * 1024
KEYS = [b"rb-%d" % i for i in range(8)]
BLOCKS = [bytes([i + 1]) * BLOCK for i in range(8)]


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(readback, "QUIET_S", 0.3)  # the tier idle after 0.3 s without stores


def _config(root: Path, delay: float, **more: Any) -> dict[str, Any]:
    """One persistent ``sample-slow`` tier in ``root``; a get is held ``delay`` s a MiB
    (1.0: 62.5 ms a 64 KiB block, against 16 ms to recompute its 16 tokens at 1 ms)."""
    return {"chain": [{"name": "slow", "backend": "sample-slow", "root": str(root),
                       "delay_per_mib": delay, "persistent": True}], **more}


def _computing_process(config: dict[str, Any], wait: bool = False) -> dict[str, Any]:
    """What an engine's first process does: it learns 1 ms a token from its recomputes and
    stores the prompt's blocks; it never reads the tier.  Its tier's stats at the end."""
    with kvtier.open_chain(config, NS, registry=BackendRegistry()) as chain:
        for tokens in (512, 1024, 2048):
            assert chain.recompute.observe(tokens, tokens * 1e-3)
        assert chain.put(KEYS, BLOCKS) == [True] * 8
        tier = chain.stats()["tiers"][0]
        assert (tier["read_backs"], tier["hits"]) == (0, 0)  # none on the store's path
        if wait:  # the tier idle: read back by the chain's own thread, before the close
            deadline = time.monotonic() + 10
            while (not chain.stats()["tiers"][0]["load_cost"]["measured"]
                   and time.monotonic() < deadline):
                time.sleep(0.05)
        return dict(chain.stats()["tiers"][0])


@pytest.mark.parametrize("wait", [True, False], ids=["idle", "at close"])
def test_the_process_after_the_computing_one_declines_a_slow_tier_unread(
    tmp_path: Path, sample_plugin: str, wait: bool
) -> None:
    """Read back once the stores stop, or at close where the process ends first: either way
    the next process declines the tier by that fit, with no probe and no read."""
    config = _config(tmp_path / "slow", 1.0)
    first = _computing_process(config, wait)
    if wait:
        # a read-back is checked but no hit: it serves no one (exact hit counts hold)
        assert (first["read_backs"], first["hits"], first["probes"]) == (2, 0, 0)
        cost = first["load_cost"]
        assert (cost["source"], cost["samples"]) == ("read-back", 1)
        assert cost["block_s"] > 0.0625 * 0.9  # what the tier takes a 64 KiB block
    with kvtier.open_chain(config, NS, registry=BackendRegistry()) as chain:
        assert chain.prefix_hits(KEYS) == 0
        slow = chain.stats()["tiers"][0]
        assert (slow["probes"], slow["hits"], slow["kept_costs"], slow["declined"]) == (
            0, 0, 1, 8)
        assert (slow["load_cost"]["source"], slow["load_cost"]["samples"]) == (
            "kept read-back", 1)


def test_a_fast_tier_read_back_is_loaded_and_probed_as_before(
    tmp_path: Path, sample_plugin: str
) -> None:
    """A read-back that says the tier is fast (as a cache the write filled would) is kept,
    but never taken as a reason to skip the probe: the next process probes, and loads."""
    config = _config(tmp_path / "fast", 0.0)
    first = _computing_process(config, wait=True)
    assert first["read_backs"] == 2 and first["load_cost"]["source"] == "read-back"
    with kvtier.open_chain(config, NS, registry=BackendRegistry()) as chain:
        assert chain.prefix_hits(KEYS) == 8
        slow = chain.stats()["tiers"][0]
        assert (slow["kept_costs"], slow["probes"]) == (0, 1)
        out = [bytearray(BLOCK) for _ in KEYS]
        assert chain.get(KEYS, out) == [True] * 8
        assert [bytes(o) for o in out] == BLOCKS


def test_a_damaged_block_read_back_is_no_sample(tmp_path: Path, sample_plugin: str) -> None:
    """The blocks read back are checked as every read is: damaged on disk after the store,
    they are misses counted as corrupt, the tier stays unmeasured, and nothing is kept."""
    root = tmp_path / "slow"
    config = _config(root, 1.0)
    with kvtier.open_chain(config, NS, registry=BackendRegistry()) as chain:
        for tokens in (512, 1024, 2048):
            chain.recompute.observe(tokens, tokens * 1e-3)
        assert chain.put(KEYS, BLOCKS) == [True] * 8
        for key in KEYS[-readback.READS:]:
            (path,) = root.glob(f"*/{key.hex()}")
            data = bytearray(path.read_bytes())
            data[-1] ^= 0xFF
            path.write_bytes(bytes(data))
    # closed: what was due was read back at close, found damaged, and not kept
    with kvtier.open_chain(config, NS, registry=BackendRegistry()) as chain:
        assert chain.prefix_hits(KEYS[:4]) == 0  # measured by a probe, not a kept fit
        slow = chain.stats()["tiers"][0]
        assert (slow["kept_costs"], slow["probes"]) == (0, 2)


def test_no_read_back_where_loads_are_not_weighed_or_the_tier_is_measured(
    tmp_path: Path, sample_plugin: str
) -> None:
    with kvtier.open_chain(_config(tmp_path / "a", 1.0, load_policy="always"), NS,
                           registry=BackendRegistry()) as chain:
        chain.put(KEYS, BLOCKS)
        time.sleep(0.6)
        assert chain.stats()["tiers"][0]["read_backs"] == 0
    with kvtier.open_chain(_config(tmp_path / "b", 0.0), NS, registry=BackendRegistry()) as chain:
        chain.put(KEYS[:2], BLOCKS[:2])
        out = [bytearray(BLOCK) for _ in range(2)]
        assert chain.get(KEYS[:2], out) == [True, True]  # a load measures it first
        time.sleep(0.6)
        assert chain.stats()["tiers"][0]["read_backs"] == 0
        assert chain.stats()["tiers"][0]["load_cost"]["source"] == "load"


def test_stores_that_keep_coming_wait_the_read_back(tmp_path: Path, sample_plugin: str) -> None:
    """While stores land, the tier is not idle: no read-back until they stop for QUIET_S."""
    with kvtier.open_chain(_config(tmp_path / "s", 0.0), NS, registry=BackendRegistry()) as chain:
        for key, block in zip(KEYS, BLOCKS):
            chain.put([key], [block])
            time.sleep(0.1)
            assert chain.stats()["tiers"][0]["read_backs"] == 0
        deadline = time.monotonic() + 10
        while (not chain.stats()["tiers"][0]["load_cost"]["measured"]
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert chain.stats()["tiers"][0]["read_backs"] == 2


def test_events_and_prometheus_show_the_read_back_cost(tmp_path: Path, sample_plugin: str) -> None:
    """An event's ``load_s`` is the read-back fit's block time, with ``load_source``; the
    exposition has it as ``kvtier_tier_block_load_seconds`` and, by source, the samples."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    config = _config(tmp_path / "slow", 1.0, metrics={"prometheus_port": port})
    with kvtier.open_chain(config, NS, registry=BackendRegistry()) as chain:
        events: list[Any] = []
        seen = threading.Event()
        chain.add_listener(lambda e: (events.append(e), seen.set()))
        chain.put(KEYS, BLOCKS)
        deadline = time.monotonic() + 10
        while (not chain.stats()["tiers"][0]["load_cost"]["measured"]
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert [(e.load_s, e.load_source) for e in events] == [(0.0, "none")]  # unmeasured
        block_s = chain.stats()["tiers"][0]["load_cost"]["block_s"]
        assert block_s > 0.0625 * 0.9
        events.clear()
        assert chain.evict(KEYS[:1]) == 1
        assert [(e.load_s, e.load_source) for e in events] == [
            (pytest.approx(block_s, rel=0.05), "read-back")]
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=10).read().decode()
    labels = f'backend="sample-slow",namespace="{NS.hex}",tier="slow"'
    line = next(x for x in text.splitlines()
                if x.startswith(f"kvtier_tier_block_load_seconds{{{labels}}}"))
    assert float(line.split()[-1]) == pytest.approx(block_s, rel=0.05)
    assert f"kvtier_tier_read_back_blocks_total{{{labels}}} 2.0" in text
    assert [x for x in text.splitlines() if x.startswith("kvtier_tier_load_samples{")] == [
        f'kvtier_tier_load_samples{{backend="sample-slow",namespace="{NS.hex}",'
        f'source="read-back",tier="slow"}} 1.0']


def test_prometheus_shows_why_a_tier_was_declined_unread(
    tmp_path: Path, sample_plugin: str
) -> None:
    """The process after the computing one declines the slow tier by the fit it kept: the
    exposition says so (a kept cost, no probe, the fit's source), not only that it declined."""
    config = _config(tmp_path / "slow", 1.0)
    _computing_process(config, wait=True)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    with kvtier.open_chain({**config, "metrics": {"prometheus_port": port}}, NS,
                           registry=BackendRegistry()) as chain:
        assert chain.prefix_hits(KEYS) == 0
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                      timeout=10).read().decode()
    labels = f'backend="sample-slow",namespace="{NS.hex}",tier="slow"'
    assert f"kvtier_tier_kept_costs_total{{{labels}}} 1.0" in text
    assert f"kvtier_tier_declined_blocks_total{{{labels}}} 8.0" in text
    assert f"kvtier_tier_probed_blocks_total{{{labels}}} 0.0" in text
    assert (f'kvtier_tier_load_samples{{backend="sample-slow",namespace="{NS.hex}",'
            f'source="kept read-back",tier="slow"}} 1.0') in text
    assert f'kvtier_recompute_samples{{namespace="{NS.hex}",source="learned"}} 3.0' in text
