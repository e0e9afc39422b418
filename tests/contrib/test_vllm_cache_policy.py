"""kvtier's eviction policies in vLLM's CPU tier: the real ``CPUOffloadingManager`` drives them.

Each sequence runs through vLLM's manager with its built-in ``lru`` and with
kvtier's classes loaded as vLLM loads them (``eviction_policy`` +
``cache_policy_module_path``), and checks what vLLM's own tests check of its
policies: a chunk being stored or loaded, or offered again by the store
that needs room, is never evicted; a store that cannot get room returns
``None`` and changes nothing; a failed store frees its chunk.  Then that the
victims are kvtier's policy's own decisions.  The same checks run again
under vLLM 0.33.0 and 0.34.0 (``make vllm-releases``), whose ``insert``
takes the request and whose ``touch`` is gone.
"""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager

from kvtier.contrib.vllm.args import CACHE_POLICY_MODULE
from kvtier.contrib.vllm.cache_policy import (
    POLICY_CLASSES,
    KvtierCachePolicy,
    live_policies,
)
from kvtier.policies import new_policy

REPO = Path(__file__).resolve().parents[2]
RELEASES = {v: REPO / "build" / f"vllm-{v}" / "bin" / "python" for v in ("0.33.0", "0.34.0")}
KVTIER = ["LruCachePolicy", "ArcCachePolicy", "S3FifoCachePolicy", "AdaptiveCachePolicy"]
ALL = ["lru", *KVTIER]  # vLLM's own LRU first: the reference


def manager(policy: str, chunks: int) -> CPUOffloadingManager:
    module = None if policy == "lru" else CACHE_POLICY_MODULE
    return CPUOffloadingManager(num_chunks=chunks, cache_policy=policy,
                                cache_policy_module_path=module, enable_events=True)


def key(i: int) -> bytes:
    return b"k%06d" % i


def keys(*ids: int) -> list[bytes]:
    return [key(i) for i in ids]


def ctx(name: str = "r") -> ReqContext:
    return ReqContext(req_id=name)


def store(m: CPUOffloadingManager, *ids: int, ok: bool = True) -> list[bytes] | None:
    """One request stores ``ids`` and finishes; the keys evicted for it, or None."""
    req = ctx()
    out = m.prepare_store(keys(*ids), req)
    if out is None:
        return None
    m.complete_store(out.keys_to_store, req, success=ok)
    m.on_request_finished(req)
    return list(out.evicted_keys)


def reuse(m: CPUOffloadingManager, *ids: int) -> None:
    """One request loads ``ids`` from the CPU tier and finishes (a use of each)."""
    req = ctx()
    m.prepare_load(keys(*ids), req)
    m.complete_load(keys(*ids), req)
    m.on_request_finished(req)


def held(m: CPUOffloadingManager, ids: range) -> set[int]:
    return {i for i in ids if m.lookup(key(i), ctx()) is LookupResult.HIT}


def test_vllm_loads_each_class_by_name_and_module() -> None:
    for name in KVTIER:
        m = manager(name, 4)
        assert type(m._policy).__name__ == name
        assert isinstance(m._policy, KvtierCachePolicy) and m._policy in live_policies()
    assert {cls.eviction for cls in POLICY_CLASSES.values()} == {
        "lru", "arc", "s3fifo", "adaptive"}


@pytest.mark.parametrize("policy", ALL)
def test_a_chunk_offered_again_is_not_evicted_by_that_store(policy: str) -> None:
    # vLLM's regression scenario: 2 is the oldest, but offered again with 3, 4, 5
    m = manager(policy, 4)
    assert store(m, 1, 2) == []
    reuse(m, 1)
    req = ctx()
    out = m.prepare_store(keys(2, 3, 4, 5), req)
    assert out is not None and out.keys_to_store == keys(3, 4, 5)
    assert out.evicted_keys == keys(1)
    m.complete_store(keys(2, 3, 4, 5), req)
    assert held(m, range(1, 6)) == {2, 3, 4, 5}


@pytest.mark.parametrize("policy", ALL)
def test_no_room_returns_none_and_changes_nothing(policy: str) -> None:
    m = manager(policy, 4)
    for i in (1, 2, 3, 4):
        assert store(m, i) == []
    loading = ctx("loader")
    m.prepare_load(keys(1, 2, 3), loading)  # pinned while the engine copies them
    before = m._policy.stats() if policy != "lru" else None
    assert m.prepare_store(keys(5, 6), ctx()) is None  # only 4 may go
    assert held(m, range(1, 7)) == {1, 2, 3, 4}
    if before is not None:
        assert m._policy.stats() == before
    assert store(m, 5) == keys(4)  # the one free to go
    m.complete_load(keys(1, 2, 3), loading)
    assert len(store(m, 6, 7) or []) == 2


@pytest.mark.parametrize("policy", ALL)
def test_a_failed_store_frees_its_chunk(policy: str) -> None:
    m = manager(policy, 2)
    assert store(m, 1, ok=False) == []
    assert held(m, range(1, 4)) == set()
    assert store(m, 2, 3) == []  # both chunks free again
    assert held(m, range(1, 4)) == {2, 3}


@pytest.mark.parametrize("policy", ALL)
def test_random_traffic_never_evicts_a_pinned_or_offered_chunk(policy: str) -> None:
    """Stores overlap loads and other stores; every answer is checked against a model."""
    rng = random.Random(7)
    m = manager(policy, 12)
    pending: dict[str, tuple[ReqContext, list[bytes]]] = {}  # stores in flight
    loads: list[tuple[ReqContext, list[bytes]]] = []
    resident: dict[bytes, int] = {}  # key -> -1 being stored, else loads in flight
    for step in range(3000):
        op = rng.random()
        if op < 0.45:  # a request offers a prefix: some stored, some new
            base = rng.choice([0, 0, 100, 200, rng.randrange(300, 2000)])
            offer = keys(*range(base, base + rng.randint(1, 6)))
            req = ctx(f"s{step}")
            new = [k for k in offer if k not in resident]
            free_to_go = sum(1 for k, c in resident.items() if c == 0 and k not in offer)
            need = len(new) - (12 - len(resident))
            out = m.prepare_store(offer, req)
            if need > free_to_go:
                assert out is None
                continue
            assert out is not None and out.keys_to_store == new
            for victim in out.evicted_keys:
                assert resident.pop(victim) == 0 and victim not in offer
            for k in new:
                resident[k] = -1
            pending[req.req_id] = (req, new)
        elif op < 0.7 and pending:  # a store lands (or fails)
            req, new = pending.pop(rng.choice(sorted(pending)))
            ok = rng.random() < 0.9
            m.complete_store(new, req, success=ok)
            for k in new:
                if ok:
                    resident[k] = 0
                else:
                    del resident[k]
            m.on_request_finished(req)
        elif op < 0.85:  # a request loads a few ready chunks
            ready = [k for k, c in resident.items() if c >= 0]
            if ready:
                req = ctx(f"l{step}")
                chosen = rng.sample(ready, min(len(ready), rng.randint(1, 3)))
                m.prepare_load(chosen, req)
                for k in chosen:
                    resident[k] += 1
                loads.append((req, chosen))
        elif loads:  # a load completes
            req, chosen = loads.pop(rng.randrange(len(loads)))
            m.complete_load(chosen, req)
            for k in chosen:
                resident[k] -= 1
            m.on_request_finished(req)
        assert len(resident) <= 12
        for k, count in resident.items():
            found = m.lookup(k, ctx())
            assert found is (LookupResult.HIT_PENDING if count < 0 else LookupResult.HIT)
    if policy != "lru":
        stats = m._policy.stats()
        assert stats["chunks"] == len(resident) and stats["evictions"] > 100


@pytest.mark.parametrize("policy", ["S3FifoCachePolicy", "AdaptiveCachePolicy",
                                    "LruCachePolicy"])
def test_the_victims_are_the_kvtier_policys_own(policy: str) -> None:
    """With nothing pinned, vLLM evicts exactly what the host tier's policy object evicts.

    Not ``arc``: vLLM makes room before it inserts, so the eviction for a
    key found among ARC's ghosts runs before that hit moves ``p``.
    """
    eviction = POLICY_CLASSES[policy.removesuffix("CachePolicy").lower()].eviction
    rng = random.Random(3)
    m = manager(policy, 50)
    plain = new_policy(eviction, 50)
    expected: list[bytes] = []
    got: list[bytes] = []
    for _ in range(6000):
        k = key(rng.choice([rng.randrange(40), rng.randrange(40, 400)]))
        if m.lookup(k, ctx()) is LookupResult.HIT:
            reuse(m, int(k[1:]))
            assert plain.access(k)
        else:  # the host tier's get (a miss), then its put
            got += store(m, int(k[1:])) or []
            assert not plain.access(k)
            expected += plain.admit(k, 1)
    assert len(got) > 1000 and got == expected


@pytest.mark.parametrize("policy", ["S3FifoCachePolicy", "AdaptiveCachePolicy"])
def test_reused_chunks_survive_one_off_chunks_that_flush_vllms_lru(policy: str) -> None:
    """4 shared chunks asked for again after every 17 one-off chunks, in a tier of 20."""
    hits = {}
    kept = {}
    for name in ("lru", policy):
        m = manager(name, 20)
        hits[name] = 0
        fresh = iter(range(1000, 10**6))
        for _ in range(300):
            for hot in range(4):
                if held(m, range(hot, hot + 1)):
                    reuse(m, hot)
                    hits[name] += 1
                else:
                    store(m, hot)
            for _ in range(17):
                store(m, next(fresh))
        kept[name] = held(m, range(4))
    assert hits["lru"] == 0 and kept["lru"] != set(range(4))
    assert kept[policy] == set(range(4)) and hits[policy] > 600  # of 1200


def test_a_victim_vllm_pinned_leaves_first_at_the_next_eviction() -> None:
    """LRU's victim is being loaded: the next one goes, and it goes next time, as in vLLM's lru."""
    runs = {}
    for name in ("lru", "LruCachePolicy"):
        m = manager(name, 4)
        for i in (1, 2, 3, 4):
            store(m, i)
        loading = ctx("loader")
        m.prepare_load(keys(1), loading)
        first = store(m, 5)
        m.complete_load(keys(1), loading)  # no request finished: not a use
        runs[name] = (first, store(m, 6))
        if name != "lru":
            assert m._policy.stats()["deferred"] == 1
    assert runs["lru"] == runs["LruCachePolicy"] == (keys(2), keys(1))


def test_a_pinned_victim_used_again_is_admitted_again() -> None:
    m = manager("S3FifoCachePolicy", 10)
    for i in range(10):
        store(m, i)
    loading = ctx("loader")
    m.prepare_load(keys(0), loading)  # S3-FIFO's next victim, pinned
    assert store(m, 10) == keys(1)
    assert m._policy.stats()["outside"] == 1
    m.complete_load(keys(0), loading)
    m.on_request_finished(loading)  # a use: back into the policy, as a ghost hit
    stats = m._policy.stats()
    assert stats["outside"] == 0 and stats["hits"] == 1
    for i in range(11, 30):  # one-off chunks leave from the small queue; 0 stays
        store(m, i)
    assert held(m, range(1)) == {0}


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release", list(RELEASES))
def test_the_same_checks_pass_on_later_vllm_releases(release: str) -> None:
    python = RELEASES[release]
    if not python.exists():
        pytest.skip(f"no vLLM {release} environment: run `make vllm-releases`")
    version = subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"],
                             capture_output=True, text=True, timeout=300, check=True)
    assert version.stdout.strip().startswith(release)
    proc = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
                           "-k", "not later_vllm_releases"],
                          capture_output=True, text=True, timeout=800, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-4000:]
    passed = re.search(r"(\d+) passed", proc.stdout)
    assert passed and int(passed.group(1)) >= 28 and "skipped" not in proc.stdout
