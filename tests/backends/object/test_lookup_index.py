"""``object``'s ``lookup_index`` against a real SeaweedFS: a hit's lookup answered by the
keys the instance stored, read or listed, without a HEAD; the bucket stays the authority,
so a key deleted since is a miss at get, never bytes of another block."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from seaweed import SeaweedServer, object_options

from kvtier import Namespace, open_chain
from kvtier.backends.object import presence
from kvtier.backends.object.presence import Presence
from kvtier.plugins.registry import BackendHandle, BackendRegistry

NS = "0f1e2d3c4b5a69780f1e2d3c4b5a6978"
CHAIN_NS = Namespace("object-lookup-index", dtype="float32", tokens_per_block=32)
Opener = Callable[..., BackendHandle]


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed * 7919 + size).randbytes(size)


def key(i: int) -> bytes:
    return b"index-%04d" % i


@pytest.fixture
def open_backend(s3_server: SeaweedServer, bucket: str) -> Iterator[Opener]:
    handles: list[BackendHandle] = []
    shared = object_options(s3_server, bucket)  # one prefix for the test's instances

    def opener(**over: Any) -> BackendHandle:
        handle = BackendRegistry().create("object")
        handle.open({**shared, **over}, NS)
        handles.append(handle)
        return handle

    yield opener
    for handle in handles:
        handle.close()


def heads(handle: BackendHandle) -> int:
    return int(handle.stats()["heads"])


def wait_listed(handle: BackendHandle, n: int) -> None:
    """Until the LIST at open (a thread of its own) is done and has learned ``n`` keys."""
    lister = getattr(handle.instance, "_lister", None)
    if lister is not None:
        lister.join(10)
    deadline = time.monotonic() + 10
    while handle.stats().get("lookup_index_entries", 0) < n and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_fresh_instance_answers_a_hit_from_its_listing_without_heads(
    open_backend: Opener,
) -> None:
    keys, blocks = [key(i) for i in range(64)], [blob(4096, i) for i in range(64)]
    assert open_backend().put(keys, blocks, []) == [True] * 64
    reader = open_backend()  # a new process's instance: nothing stored or read by it
    wait_listed(reader, 64)
    assert list(reader.lookup([*keys, key(99)])) == [True] * 64 + [False]
    assert heads(reader) == 1  # the key never stored alone was asked of the bucket
    assert [bytes(b) for b in reader.get(keys)] == blocks


def test_a_key_found_by_a_head_is_known_after(open_backend: Opener) -> None:
    # answers of the short-lived cache last 1 ms: what answers later is the index
    reader = open_backend(lookup_cache_ttl="1ms")
    wait_listed(reader, 0)  # its LIST at open is over: it cannot list the key put below
    open_backend().put([key(1)], [blob(100, 1)], [])
    before = heads(reader)
    assert list(reader.lookup([key(1)])) == [True]
    time.sleep(0.01)
    assert list(reader.lookup([key(1)])) == [True]
    assert heads(reader) == before + 1
    assert list(reader.lookup([key(2)])) == [False]
    time.sleep(0.01)
    assert list(reader.lookup([key(2)])) == [False]  # absent keys are asked each time
    assert heads(reader) == before + 3


def test_a_stale_entry_is_a_miss_at_get_never_other_bytes(
    s3_server: SeaweedServer, bucket: str
) -> None:
    tier = {"name": "s3", "backend": "object", **object_options(s3_server, bucket)}
    keys = [b"stale-%d" % i for i in range(3)]
    size = 64 << 10
    old = [blob(size, i) for i in range(3)]
    with open_chain({"chain": [tier]}, namespace=CHAIN_NS) as writer:
        assert writer.put(keys, old) == [True] * 3
        with open_chain({"chain": [tier]}, namespace=CHAIN_NS) as reader:
            backend = reader.stats()["tiers"][0]["backend_stats"]
            deadline = time.monotonic() + 10
            while backend.get("lookup_index_entries", 0) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
                backend = reader.stats()["tiers"][0]["backend_stats"]
            # another writer deletes block 0 and stores other bytes under key 1
            assert writer.evict(keys[:2]) == 2
            new = blob(size, 7)
            assert writer.put([keys[1]], [new]) == [True]
            # the reader never asked: its short-lived cache has no answer, the index has
            assert reader.lookup(keys) == [0, 0, 0]  # block 0 held as far as it knows
            outs = [bytearray(b"\xa5" * size) for _ in keys]
            assert reader.get(keys, outs) == [False, True, True]
            assert bytes(outs[0]) == b"\xa5" * size  # nothing of another block
            assert [bytes(o) for o in outs[1:]] == [new, old[2]]
            assert reader.lookup(keys) == [None, 0, 0]  # the miss dropped it


def test_an_expired_entry_is_never_answered(open_backend: Opener) -> None:
    store = open_backend(expire="2s", lookup_cache_ttl="1ms")
    store.put([key(1)], [blob(100, 1)], [])
    time.sleep(0.01)
    before = heads(store)
    assert list(store.lookup([key(1)])) == [True]
    assert heads(store) == before  # its put's time is known: no HEAD
    time.sleep(3.2)  # last-modified times have a resolution of one second
    assert list(store.lookup([key(1)])) == [False]
    assert store.get([key(1)]) == [None]


@pytest.mark.parametrize("off", [{"lookup_index": 0}, {"lookup_cache_ttl": 0}])
def test_off_every_lookup_asks_the_bucket(open_backend: Opener, off: dict[str, Any]) -> None:
    open_backend().put([key(1)], [blob(100, 1)], [])
    store = open_backend(**{"lookup_cache_ttl": "1ms", **off})
    time.sleep(0.2)
    for n in (1, 2, 3):
        time.sleep(0.01)
        assert list(store.lookup([key(1)])) == [True]
        assert heads(store) == n
    assert store.stats()["lookup_index_entries"] == 0


# --- the index alone (no server) ------------------------------------------------------


def test_a_key_dropped_while_a_list_ran_is_not_learned_from_it() -> None:
    known = Presence(0.0, lifetime=60.0)
    started = known.listing_started()
    known.drop(b"a")  # evicted after the LIST read its page
    known.listed([(b"a", time.time()), (b"b", time.time())], started, whole=True)
    assert (known.get(b"a", time.monotonic()), known.get(b"b", time.monotonic())) == (None, True)


def test_a_whole_list_forgets_what_it_did_not_find() -> None:
    known = Presence(0.0, lifetime=60.0)
    known.remember(b"gone", True)
    known.remember(b"kept", True)
    started = known.listing_started()
    known.remember(b"new", True)  # stored while the LIST ran: not in it, still held
    known.listed([(b"kept", time.time())], started, whole=True)
    now = time.monotonic()
    assert [known.get(k, now) for k in (b"gone", b"kept", b"new")] == [None, True, True]
    started = known.listing_started()
    known.listed([], started, whole=False)  # a partial LIST proves nothing gone
    assert known.known == 2


def test_entries_leave_after_their_lifetime_and_past_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    known = Presence(0.0, lifetime=0.05)
    known.remember(b"a", True)
    assert known.get(b"a", time.monotonic()) is True
    assert known.get(b"a", time.monotonic() + 0.06) is None
    monkeypatch.setattr(presence, "KNOWN_MAX", 3)
    for k in (b"1", b"2", b"3", b"4"):
        known.remember(k, True)
    assert [known.get(k, time.monotonic()) for k in (b"1", b"2", b"3", b"4")] == [
        None, True, True, True]
    known.max_age = 10.0  # an age unknown is never learned where objects expire
    known.remember(b"5", True)
    known.remember(b"6", True, time.time() - 11)
    assert known.get(b"5", time.monotonic()) is None
    assert known.get(b"6", time.monotonic()) is None
