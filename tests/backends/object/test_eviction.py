"""The object tier's ``eviction: s3fifo`` against SeaweedFS: the bucket keeps what S3-FIFO keeps.

The model is :class:`kvtier.policies.S3Fifo` itself (the host tier's
and ``kvtier plan``'s), fed the same admits and uses: the objects left in the
bucket must be exactly the keys it holds.  The kit's capacity group runs on
the tier with ``eviction: s3fifo`` as on the default (``test_conformance.py``).
"""

from __future__ import annotations

import random
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from seaweed import SeaweedServer
from sizing_replay import document_batches, replay

from kvtier.backends.object import ObjectBackend
from kvtier.plugins.registry import BackendHandle, BackendRegistry
from kvtier.policies import S3Fifo
from kvtier.spec import ConfigError
from kvtier.testing.capacity import CapacityTests

NS = "5eed0000000000000000000000000000"
Opener = Callable[..., BackendHandle]
#: No LIST pass while a test runs (unless it asks): the index is the instance's own puts.
QUIET = {"scan_interval": "100000h", "lookup_cache_ttl": 0}


def key(i: int) -> bytes:
    return i.to_bytes(4, "big") + b"evict"


def block(i: int, size: int) -> bytes:
    return random.Random(i * 7919 + size).randbytes(size)


@pytest.fixture
def open_object(s3_server: SeaweedServer, bucket: str) -> Iterator[Opener]:
    """Opens ``object`` tiers on ``bucket`` (every option passed); closes them after."""
    handles: list[BackendHandle] = []

    def open_(namespace: str = NS, **over: Any) -> BackendHandle:
        handle = BackendRegistry().create("object")
        options = {name: o.default for name, o in ObjectBackend().kvtier_options().items()}
        options.update(bucket=bucket, endpoint=s3_server.endpoint, region=s3_server.region,
                       access_key_id=s3_server.access_key,
                       secret_access_key=s3_server.secret_key, **over)
        handle.open(options, namespace)
        handles.append(handle)
        return handle

    yield open_
    for handle in handles:
        handle.close()


def as_bytes(blocks: Any) -> list[bytes | None]:
    return [None if b is None else bytes(b) for b in blocks]


def settle(tier: BackendHandle) -> None:
    """Wait for the LIST pass a put may have started (``scan_interval: 0s``)."""
    instance = tier.instance
    assert isinstance(instance, ObjectBackend)
    cleaner = instance._cleaner
    if cleaner is not None:
        cleaner.join()


def in_bucket(open_: Opener, keys: list[bytes]) -> set[bytes]:
    """The keys among ``keys`` stored in the namespace, asked by an instance without capacity."""
    probe = open_(lookup_cache_ttl=0)
    return {k for k, there in zip(keys, probe.lookup(keys)) if there}


@pytest.mark.parametrize("scan_interval", ["100000h", "0s"])
def test_the_bucket_keeps_what_s3fifo_keeps(open_object: Opener, scan_interval: str) -> None:
    """Random puts (batches, repeats) and gets: each get hits exactly the keys the model
    holds, byte for byte, and the objects left are the model's; with ``0s`` a LIST pass
    after every put rebuilds the index and must keep the queues and counts."""
    capacity = 12_000
    tier = open_object(capacity=capacity, eviction="s3fifo", scan_interval=scan_interval,
                       lookup_cache_ttl=0, sizing_sample=0)
    model = S3Fifo(capacity)
    fifo: OrderedDict[bytes, int] = OrderedDict()  # what the oldest-first tier would keep
    rng = random.Random(11)
    sizes = {key(i): rng.randrange(500, 1500) for i in range(30)}
    hot = [key(i) for i in range(4)]
    evictions = 0
    for step in range(70):
        keys = list(dict.fromkeys(rng.choice(hot) if rng.random() < 0.4
                                  else key(rng.randrange(30)) for _ in range(rng.randint(1, 3))))
        if rng.random() < 0.5:
            assert tier.put(keys, [block(int.from_bytes(k[:4]), sizes[k]) for k in keys],
                            []) == [True] * len(keys)
            settle(tier)
            held = [k for k in keys if model.size(k) is not None]
            for k in held:
                model.access(k)  # a put of a key held is a use
            for k in keys:
                if k not in held:
                    evictions += len(model.admit(k, sizes[k]))
                    fifo[k] = sizes[k]
            while sum(fifo.values()) > capacity:
                fifo.popitem(last=False)
            continue
        found = tier.get(keys)
        for k, data in zip(keys, found):
            assert (data is not None) == model.access(k), (step, k)
            if data is not None:
                assert bytes(data) == block(int.from_bytes(k[:4]), sizes[k])
    kept = {k for k, _ in model.held()}
    assert evictions > 5 and kept != set(fifo)  # the sequence tells the policies apart
    assert in_bucket(open_object, list(sizes)) == kept
    stats = tier.stats()
    assert (stats["used_bytes"], stats["blocks"]) == (model.used, len(kept))
    survivors = sorted(kept)
    assert as_bytes(tier.get(survivors)) == [block(int.from_bytes(k[:4]), sizes[k])
                                             for k in survivors]


@pytest.mark.parametrize(("eviction", "survives"), [("fifo", False), ("s3fifo", True)])
def test_a_hot_set_survives_a_scan_only_under_s3fifo(
    open_object: Opener, eviction: str, survives: bool
) -> None:
    """Two hot blocks read again between one-off blocks (three times the capacity in all)."""
    size, capacity = 1000, 10_000
    tier = open_object(capacity=capacity, eviction=eviction, **QUIET)
    hot = [key(0), key(1)]
    hot_blocks = [block(0, size), block(1, size)]
    assert tier.put(hot, hot_blocks, []) == [True, True]
    assert as_bytes(tier.get(hot)) == hot_blocks
    for i in range(100, 130):
        assert tier.put([key(i)], [block(i, size)], []) == [True]
        if i % 3 == 0:
            tier.get(hot)
    assert as_bytes(tier.get(hot)) == (hot_blocks if survives else [None, None])
    left = in_bucket(open_object, [key(i) for i in (0, 1, *range(100, 130))])
    assert len(left) * size <= capacity
    assert (key(0) in left, key(1) in left) == (survives, survives)


def test_eviction_is_checked_and_declared(open_object: Opener) -> None:
    tier = open_object(capacity=10_000, eviction="s3fifo", **QUIET)
    assert tier.capabilities().eviction == "s3fifo"
    assert open_object(**QUIET).capabilities().eviction == "fifo"
    with pytest.raises(ConfigError, match="fifo"):
        open_object(capacity=10_000, eviction="lru", **QUIET)


class TestObjectS3FifoCapacity(CapacityTests):
    backend = "object"

    @pytest.fixture
    def backend_options(self, s3_server: SeaweedServer, kit_bucket: str) -> dict[str, Any]:
        # small: the group puts three times the capacity, block by block
        return {"bucket": kit_bucket, "endpoint": s3_server.endpoint, "region": s3_server.region,
                "access_key_id": s3_server.access_key, "secret_access_key": s3_server.secret_key,
                "allow_http": True, "prefix": f"kit/{uuid.uuid4().hex[:8]}",
                "capacity": "1MiB", "eviction": "s3fifo"}


def test_sizing_runs_s3fifo_miniatures(open_object: Opener) -> None:
    """At ``sizing_sample`` 1 each miniature is an s3fifo object tier of its capacity."""
    size, blocks = 64, 40
    tier = open_object(capacity=blocks * size, eviction="s3fifo", sizing_sample=1, **QUIET)
    others = {m: open_object(f"{n:032x}", capacity=int(blocks * m) * size, eviction="s3fifo",
                             sizing_sample=0, **QUIET)
              for n, m in enumerate((0.5, 1, 2), start=1)}
    real = replay(tier, others, document_batches(40), bytes(size))
    stats = tier.stats()
    assert stats["sizing_gets"] == real.gets
    for m in others:
        assert stats[f"sizing_hit_ratio_{m:g}x"] == real.ratio(m), m
    assert 0 < real.hits[0.5] < real.hits[1] < real.hits[2]
